"""The ``fbands`` command line.

Sub-commands live next to the code they drive: each module in ``_COMMAND_MODULES`` has a
``register(subparsers)`` that adds its parsers and sets ``func`` (called with the parsed
arguments, returning an exit code).  Registering must be cheap: heavy imports (torch,
transformers, matplotlib) happen inside the command functions.  A sub-command whose optional
dependencies come as one extra sets ``needs`` to it (``set_defaults(needs="rl")``), so that a
missing package names that extra rather than the smaller one that holds the package.

Every mistake a user can make prints one line on stderr, ``fbands: error: ...``, that names
the fix, and exits with code 2: a malformed command line, a value or divergence that the
library refuses (:data:`LIBRARY_ERRORS`), an optional package that is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from fbands import __version__
from fbands._optional import EXTRAS, MissingDependencyError
from fbands.errors import BandError, ConfigError, DivergenceError, LossError

#: errors printed as one line with exit code 2 (wrong input or a missing extra, not a bug)
LIBRARY_ERRORS = (BandError, DivergenceError, LossError, ConfigError, MissingDependencyError)

_COMMAND_MODULES = ("fbands._cli_core", "fbands.rl.cli")
#: extra -> the extras it brings (a command that ``needs`` it names it for any of them)
_BUNDLES = {"rl": ("torch", "plot", "rl"), "plot": ("plot",)}
#: the image formats ``-o`` / ``--out`` accept (matplotlib's, without extra packages)
IMAGE_FORMATS = ("png", "pdf", "svg", "svgz", "jpg", "jpeg", "tif", "tiff", "webp", "eps",
                 "ps")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line that points at the command's ``--help``."""

    def error(self, message: str):
        self.exit(2, f"fbands: error: {' '.join(message.split())} "
                     f"(see: {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def image_path(text: str) -> Path:
    """An argparse ``type``: the image file to write, ``.png`` added when it has no
    extension (what matplotlib itself would do), so that the path printed is the path
    written; an extension matplotlib cannot write is refused."""
    path = Path(text)
    if not path.name:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name")
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix[1:].lower() not in IMAGE_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown image format {path.suffix!r}; use one of "
            f"{', '.join('.' + f for f in IMAGE_FORMATS)}")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fbands",
        description="Probability-aware trust regions (f-divergence bands) for RL on LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"fbands {__version__}")
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
    configuration) are the user's to fix, and so is an optional package that is not
    installed: they print as one line, ``fbands: error: ...`` (for a missing package, the
    ``pip install`` command of the extra that brings it), and give exit code 2, like a bad
    command-line argument (which argparse reports the same way, by raising ``SystemExit``).
    An operating-system error (a file that cannot be written) prints the same way with exit
    code 1.  Anything else is a bug and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ImportError as err:
        message = missing_message(err, args.command, getattr(args, "needs", None))
        if message is None:
            raise
        print(f"fbands: error: {message}", file=sys.stderr)
        return 2
    except LIBRARY_ERRORS as err:
        print(f"fbands: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the command was told to write or read: no traceback
        print(f"fbands: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def missing_message(err: ImportError, command: str, needs: str | None = None) -> str | None:
    """The one line for an optional package that ``fbands command`` found missing, naming
    the extra to install (``needs`` when that extra brings the package); None when ``err``
    is not a missing optional package (a broken install keeps its traceback).

    >>> missing_message(ModuleNotFoundError("no torch", name="torch"), "train", "rl")
    'fbands train needs torch, which is not installed: pip install "fbands[rl]"'
    """
    if isinstance(err, MissingDependencyError):
        module = err.module
    elif isinstance(err, ModuleNotFoundError) and err.name:
        module = err.name.split(".", 1)[0]
    else:
        return None
    if module not in EXTRAS:
        return None
    extra = EXTRAS[module]
    if needs is not None and extra in _BUNDLES.get(needs, ()):
        extra = needs
    elif isinstance(err, MissingDependencyError):
        return _one_line(err)
    spec = f'"fbands[{extra}]"' if extra else module
    return f"fbands {command} needs {module}, which is not installed: pip install {spec}"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
