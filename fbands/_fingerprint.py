"""What a cache key takes from fbands' own source: its code, not its words.

A stored derivation or table must be thrown away when the code that made it changes, and
must not be when only a comment or a docstring does (that would rebuild every user's cache,
and fail the test that the shipped derivations are current, for a reworded sentence).
:func:`code_fingerprint` hashes each file with its comments and docstrings cut out and its
whitespace collapsed, so that exactly an edit of the code changes it.

The cuts are found by :mod:`tokenize` (comments) and :mod:`ast` (docstrings: a string
constant as the first statement of a module, class or function), both by position in the
text, so the result does not depend on how a Python version prints or dumps a tree.
Tokenising and parsing a few thousand lines takes tens of milliseconds, which a process's
first band call would pay, so each file's digest is kept in the process and in the private
cache (``fingerprint/``) under the hash of the file's bytes: exact, and never stale.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from collections.abc import Iterable
from pathlib import Path

from fbands import _cache
from fbands._state import STATE

__all__ = ["bare_code", "code_digest", "code_fingerprint", "code_text", "package_fingerprint"]

_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings(tree: ast.AST):
    """Each ``(node, statement)`` of ``tree`` whose first statement is its docstring."""
    for node in ast.walk(tree):
        if isinstance(node, _WITH_DOCSTRING) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield node, first


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
    for _, first in _docstrings(ast.parse(source)):
        cuts.append((offset(first.lineno, char_col(first.lineno, first.col_offset)),
                     offset(first.end_lineno, char_col(first.end_lineno, first.end_col_offset))))
    kept, at = [], 0
    for start, end in sorted(cuts):
        kept.append(source[at:start])
        at = max(at, end)
    kept.append(source[at:])
    return " ".join("".join(kept).split())


def bare_code(source: str) -> str:
    """``source`` as runnable code alone: no comments, no docstrings, as :func:`ast.unparse`
    prints the tree (a body that held only its docstring gets ``pass``).

    Where a file's bytes key compiled code (numba's on-disk cache), a copy of this text
    instead of the file keeps that code valid when only words change.

    >>> print(bare_code('def f(x):  # doubled\\n    "Twice x."\\n    return 2 * x\\n'), end="")
    def f(x):
        return 2 * x
    """
    tree = ast.parse(source)
    for node, _ in list(_docstrings(tree)):
        node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def code_fingerprint(paths: Iterable[Path], *extra: str) -> str:
    """SHA-256 of the code (:func:`code_text`) of the files at ``paths``, in order, and of
    the strings ``extra`` (versions, formats)."""
    h = hashlib.sha256()
    for text in extra:
        h.update(f"{text}\n".encode())
    for path in paths:
        h.update(f"{Path(path).name} {code_digest(Path(path).read_bytes())}\n".encode())
    return h.hexdigest()


_PACKAGE = STATE.memo("package fingerprints", "the code fingerprint of each group of "
                      "fbands' own files that a disk-cache key names, by group")


def package_fingerprint(group: str, paths: Iterable[Path], *extra: str) -> str:
    """:func:`code_fingerprint` of fbands' own files (which do not change while a process
    runs): made once per process, kept under the name ``group``."""
    return _PACKAGE.get_or_make(group, lambda: code_fingerprint(tuple(paths), *extra))


#: Part of every memo's key: a change to what :func:`code_text` cuts must change it.
_VERSION = 1
_MEMO = STATE.memo("code digests", "the digest of each source text read, by the hash of its "
                   "bytes")


def code_digest(raw: bytes) -> str:
    """SHA-256 of :func:`code_text` of the UTF-8 source ``raw``, remembered by the hash of
    ``raw`` in the process and in the private cache."""
    key = hashlib.sha256(f"code_text {_VERSION}\n".encode() + raw).hexdigest()
    found = _MEMO.get(key)
    if found is not None:
        return found
    folder = _cache.private_dir("fingerprint")
    path = None if folder is None else folder / f"{key}.json"
    stored = None if path is None else _cache.read_json(path, key)
    if isinstance(stored, str):
        found = stored
    else:
        found = hashlib.sha256(code_text(raw.decode("utf-8")).encode()).hexdigest()
        if path is not None:
            _cache.write_json(path, key, found)
    return _MEMO.put(key, found)
