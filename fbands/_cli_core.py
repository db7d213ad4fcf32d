"""``fbands divergences``, ``fbands bounds``, ``fbands compile`` and ``fbands plot``."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from fbands.cli import image_path

#: ``fbands bounds --format``: the formats, the first the default
FORMATS = ("table", "csv", "json")
#: significant digits of the numbers of ``--format table`` (csv and json: every digit)
TABLE_DIGITS = 10


def register(sub) -> None:
    p = sub.add_parser("divergences", help="list the registered divergences")
    p.add_argument("--no-derive", dest="derive", action="store_false",
                   help="skip the sympy derivation (closed forms), for a quick listing")
    p.set_defaults(func=_divergences)

    p = sub.add_parser("bounds", help="print the band [lower, upper] for some p")
    p.add_argument("p", nargs="+", type=float, help="old probabilities (log-probs with --logp)")
    p.add_argument("--div", default="kl",
                   help="divergence: a name (kl, 'alpha(a=0.5)', ...) or a generator f(u) such "
                        "as '(u-1)**2/(u+1)', read by fbands' grammar (default: kl)")
    p.add_argument("--delta", type=float, default=0.05, help="radius (default: 0.05)")
    p.add_argument("--logp", action="store_true", help="the values are log-probabilities")
    p.add_argument("--backend", default="numpy",
                   help="auto, numpy, numba, torch or cvxpy, for both the edges and their logs "
                        "(default: numpy, which needs no compilation for a few values)")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help=f"table (default): aligned columns, numbers to {TABLE_DIGITS} "
                        "significant digits; csv, json: one record per value of p, each "
                        "number the shortest decimal that reads back as the same float64 "
                        "(a log of 0 is -inf in csv, null in json)")
    p.set_defaults(func=_bounds)

    p = sub.add_parser("compile", help="compile the numba kernels ahead, once per machine")
    p.add_argument("--div", action="append", default=None,
                   help="a divergence of the registry to compile for (kl, 'alpha(a=0.5)'; "
                        "repeat for several; default: every built-in that is not a family)")
    p.add_argument("--dtype", action="append", choices=("float32", "float64"), default=None,
                   help="the arrays to serve (repeat for both; default: both)")
    p.set_defaults(func=_compile)

    p = sub.add_parser("plot", help="draw bands against p next to fixed clipping")
    p.add_argument("--div", default="kl,tv,chi2",
                   help="comma-separated divergences: names, or generators f(u) such as "
                        "'(u-1)**2/(u+1)' (default: %(default)s)")
    p.add_argument("--delta", type=float, default=0.05, help="radius (default: 0.05)")
    p.add_argument("-o", "--output", type=image_path, default="band.png",
                   help="image file; .png is added to a name without extension "
                        "(default: %(default)s)")
    p.add_argument("--compare-clip", type=float, metavar="EPS", default=None,
                   help="draw instead the probability a token may gain, p (r_hi - 1), against "
                        "p, for PPO clip EPS and the bands")
    p.add_argument("--match-p", type=float, metavar="P", default=None,
                   help="with --compare-clip: give each band the radius whose upper edge at "
                        "p = P is 1 + EPS (fbands.calibrate_delta) instead of --delta")
    p.set_defaults(func=_plot, needs="plot")


def _divergences(args: argparse.Namespace) -> int:
    from fbands import divergences as registry

    rows = []
    for name in registry.available():
        if name in registry._FAMILIES:
            expr, params, desc = registry._FAMILIES[name]
            rows.append((f"{name}({', '.join(params)})", str(expr), "family", desc))
            continue
        d = registry.get(name)
        closed = "-"
        if args.derive:
            closed = "yes" if d.has_closed_form else "no"
        rows.append((name, str(d.f), closed, d.description))
    header = ("name", "f(u)", "closed form" if args.derive else "", "description")
    widths = [max(len(r[i]) for r in (*rows, header)) for i in range(4)]
    for r in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _fmt(x: float) -> str:
    """A number of the table: :data:`TABLE_DIGITS` significant digits, ``inf``, ``nan``."""
    return f"{x:.{TABLE_DIGITS}g}"


def divergence_arg(text: str, name: str):
    """The divergence that ``--div`` names: a spec of the registry (``kl``,
    ``alpha(a=0.5)``), or else a generator in ``u`` (``(u-1)**2/(u+1)``), read by fbands'
    grammar, checked and registered as ``name`` for this command (its description is the
    text)."""
    import fbands
    from fbands.errors import DivergenceError

    try:
        return fbands.get(text)
    except DivergenceError:
        if not re.search(r"\bu\b", text):
            raise  # no variable u: a name or spec that is wrong (kll, alpha(b=2), band-kl)
    try:
        return fbands.register(name, text, description=text, overwrite=True)
    except DivergenceError as err:
        raise DivergenceError(f"--div {text!r} is not a divergence of the registry, and as a "
                              f"generator f(u): {err}") from None


def _exact(x: float) -> str:
    """A number of csv: the shortest text that reads back as the same float64."""
    return repr(float(x))


def _bounds(args: argparse.Namespace) -> int:
    import numpy as np

    import fbands

    p = np.asarray(args.p, dtype=np.float64)
    div = divergence_arg(args.div, "f")
    lo, hi = fbands.bounds(p, args.delta, div, args.backend, logp=args.logp)
    llo, lhi = fbands.log_bounds(p, args.delta, div, args.backend, logp=args.logp)
    name = div.description if div.name == "f" else div.name
    keys = ("logp" if args.logp else "p", "lower", "upper", "log_lower", "log_upper")
    rows = [[float(v) for v in row] for row in zip(p, lo, hi, llo, lhi, strict=True)]
    if args.format == "json":
        records = [dict(zip(keys, [x if math.isfinite(x) else None for x in row], strict=True))
                   for row in rows]
        print(json.dumps({"div": name, "delta": args.delta, "rows": records}, allow_nan=False))
    elif args.format == "csv":
        print(",".join(("div", "delta", *keys)))
        for row in rows:
            print(",".join((name, _exact(args.delta), *map(_exact, row))))
    else:
        print(f"div={name}  delta={_fmt(args.delta)}")
        head = ("log p" if args.logp else "p", "lower", "upper", "log lower", "log upper")
        print("".join(h.rjust(18) for h in head))
        for row in rows:
            print("".join(_fmt(v).rjust(18) for v in row))
    return 0


def _compile(args: argparse.Namespace) -> int:
    import fbands
    from fbands.bands import DTYPES
    from fbands.errors import DivergenceError

    divs = None
    if args.div is not None:
        divs = []
        for text in args.div:
            if re.search(r"\bu\b", text):  # a generator: its kernels go by its name
                raise DivergenceError(
                    f"--div {text!r}: a generator's kernels are stored under the name a "
                    "program registers it by: call fbands.precompile(name) after "
                    "fbands.register(name, ...) in that program")
            divs.append(fbands.get(text))
    for name, dtype, seconds in fbands.precompile(divs, args.dtype or DTYPES):
        print(f"{name}  {dtype}  ready ({seconds:.1f} s)")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from fbands.plotting import plot_bands

    texts = [n.strip() for n in args.div.split(",") if n.strip()]
    names = [divergence_arg(text, f"f{i + 1}").name for i, text in enumerate(texts)]
    if not names:
        from fbands.errors import DivergenceError

        raise DivergenceError(f"--div {args.div!r} names no divergence")
    if args.compare_clip is None:
        if args.match_p is not None:
            from fbands.errors import BandError

            raise BandError("--match-p needs --compare-clip EPS")
        path = plot_bands(names, args.delta, args.output)
    else:
        from fbands._checks import positive
        from fbands.errors import BandError
        from fbands.plotting import plot_gain

        eps = positive("--compare-clip", args.compare_clip, BandError)
        path = plot_gain(names, args.delta, args.output, eps=eps, eps_high=None,
                         match_p=args.match_p)
    print(f"wrote {path}", file=sys.stderr)
    return 0
