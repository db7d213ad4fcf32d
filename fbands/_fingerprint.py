"""What a cache key takes from fbands' own source: its code, not its words.

A stored derivation or table must be thrown away when the code that made it changes, and
must not be when only a comment or a docstring does (that would rebuild every user's cache,
and fail the test that the shipped derivations are current, for a reworded sentence).
:func:`code_fingerprint` hashes each file with its comments and docstrings cut out and its
whitespace collapsed, so that exactly an edit of the code changes it.

The cuts are found by :mod:`tokenize` (comments) and :mod:`ast` (docstrings: a string
constant as the first statement of a module, class or function), both by position in the
text, so the result does not depend on how a Python version prints or dumps a tree.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from collections.abc import Iterable
from pathlib import Path

__all__ = ["code_fingerprint", "code_text"]

_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_text(source: str) -> str:
    """``source`` without its comments and docstrings, every run of whitespace one space.

    >>> code_text('def f(x):  # doubled\\n    "Twice x."\\n    return 2 * x\\n')
    'def f(x): return 2 * x'
    """
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int) -> int:  # (1-based row, character column)
        return starts[row - 1] + col

    def char_col(row: int, byte_col: int) -> int:  # ast's columns count UTF-8 bytes
        return len(lines[row - 1].encode()[:byte_col].decode())

    cuts = [(offset(*t.start), offset(*t.end))
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, _WITH_DOCSTRING) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                cuts.append((offset(first.lineno, char_col(first.lineno, first.col_offset)),
                             offset(first.end_lineno,
                                    char_col(first.end_lineno, first.end_col_offset))))
    kept, at = [], 0
    for start, end in sorted(cuts):
        kept.append(source[at:start])
        at = max(at, end)
    kept.append(source[at:])
    return " ".join("".join(kept).split())


def code_fingerprint(paths: Iterable[Path], *extra: str) -> str:
    """SHA-256 of the code (:func:`code_text`) of the files at ``paths``, in order, and of
    the strings ``extra`` (versions, formats)."""
    h = hashlib.sha256()
    for text in extra:
        h.update(f"{text}\n".encode())
    for path in paths:
        code = code_text(Path(path).read_text(encoding="utf-8")).encode()
        h.update(f"{Path(path).name} {len(code)}\n".encode() + code)
    return h.hexdigest()
