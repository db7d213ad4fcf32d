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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
