"""Run every benchmark script of this directory (``bench_*.py``) in turn.

``make bench`` calls this.  Arguments are passed on to each script (``--quick`` for a short
run); each script writes its JSON and markdown results to ``benchmarks/results/``.

Run::

    python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        rc = subprocess.call([sys.executable, str(script), *argv], cwd=HERE.parent)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
