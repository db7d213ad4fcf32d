"""The ``fbands`` command line.

Sub-commands live next to the code they drive: each module in ``_COMMAND_MODULES`` has a
``register(subparsers)`` that adds its parsers and sets ``func`` (called with the parsed
arguments, returning an exit code).  Registering must be cheap: heavy imports (torch,
transformers, matplotlib) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fbands.errors import BandError, ConfigError, DivergenceError, LossError

#: errors printed as one line with exit code 2 (wrong input, not a bug)
LIBRARY_ERRORS = (BandError, DivergenceError, LossError, ConfigError)

_COMMAND_MODULES = ("fbands._cli_core", "fbands.rl.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fbands",
        description="Probability-aware trust regions (f-divergence bands) for RL on LLMs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # an optional part not installed
            if err.name is None or not name.startswith(err.name):
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code.

    The library's own errors (:mod:`fbands.errors`: a bad value, divergence, loss input or
    configuration) are the user's to fix: they print as one line, ``fbands: error: ...``,
    and give exit code 2, like a bad command-line argument.  An operating-system error (a
    file that cannot be written) prints the same way with exit code 1.  Anything else is
    a bug and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LIBRARY_ERRORS as err:
        print(f"fbands: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the command was told to write or read: no traceback
        print(f"fbands: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
