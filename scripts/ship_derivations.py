"""Write the derivations of the built-in divergences into the package (fbands/_shipped/).

A fresh install then answers a built-in divergence's first call without sympy's
derivation (seconds): :func:`fbands._derived.derive` reads these files when the user's
cache misses.  Each file is what the user's cache would hold (fbands/_derived.py: verified
JSON, no pickle), named by its key; the key hashes the code of fbands/symbolic.py and
fbands/_stable.py (not their comments or docstrings) and sympy's version, so after a change
to any of them, run this again (``tests/core/test_shipped.py`` fails until then)::

    python scripts/ship_derivations.py          # rewrite fbands/_shipped/derived/
    python scripts/ship_derivations.py --check  # exit 1 when the files are not current

Every derivation is done afresh here (never read from a cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fbands import _cache, _derived, divergences, symbolic  # noqa: E402


def expected_keys() -> dict[str, str]:
    """File name -> divergence name of every file the package should ship."""
    return {f"{_derived.key(divergences._REGISTRY[n].f)}.json": n for n in divergences.BUILTINS}


def files(names: list[str] | None = None) -> dict[str, bytes]:
    """File name -> bytes of each built-in's derivation (``names``: those only)."""
    out = {}
    for name in names or divergences.BUILTINS:
        f = divergences._REGISTRY[name].f
        k = _derived.key(f)
        data = _derived.storable(symbolic.derive(f))
        if data is None:
            raise SystemExit(f"the derivation of {name!r} cannot be stored as a file")
        text = json.dumps({"key": k, "sha256": _cache._digest(data), "data": data},
                          sort_keys=True)
        out[f"{k}.json"] = text.encode()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the shipped files instead of writing them")
    args = ap.parse_args(argv)
    here = _derived.SHIPPED
    have = {p.name: p.read_bytes() for p in here.glob("*.json")} if here.is_dir() else {}
    if args.check:
        want = expected_keys()
        if set(have) != set(want):
            print(f"stale: {here} holds {sorted(have)}, the code wants {sorted(want)} "
                  f"({', '.join(want.values())}); run python scripts/ship_derivations.py")
            return 1
        print(f"{len(have)} shipped derivations are current")
        return 0
    new = files()
    here.mkdir(parents=True, exist_ok=True)
    for name in set(have) - set(new):
        (here / name).unlink()
    for name, data in new.items():
        (here / name).write_bytes(data)
    print(f"wrote {len(new)} derivations to {here}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
