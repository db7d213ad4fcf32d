"""Cache keys follow the code, not its words (fbands/_fingerprint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fbands import _derived, symbolic
from fbands import _fingerprint as fingerprint
from fbands._fingerprint import code_fingerprint, code_text
from fbands.tables import store

SYMBOLIC = Path(symbolic.__file__).read_text(encoding="utf-8")


def _fingerprint(tmp_path, text: str) -> str:
    path = tmp_path / "symbolic.py"
    path.write_text(text, encoding="utf-8")
    return code_fingerprint([path], "v")


def test_a_reworded_comment_or_docstring_keeps_the_key(tmp_path):
    reworded = (SYMBOLIC
                .replace('"""The symbolic side of fbands:', '"""The symbolic side (reworded):', 1)
                .replace("#: Below this |s| the near form of F is used.",
                         "#: A new comment.\n# and another one, on its own line", 1)
                .replace("NEAR = 0.5", "NEAR = 0.5  # an inline remark", 1))
    assert reworded != SYMBOLIC
    assert _fingerprint(tmp_path, reworded) == _fingerprint(tmp_path, SYMBOLIC)


@pytest.mark.parametrize("old, new", [
    ("NEAR = 0.5", "NEAR = 0.25"),                        # a constant of the numerics
    ("_NEAR_MAX_DEGREE = 48", "_NEAR_MAX_DEGREE = 47"),
    ("return f\"({self._print(", "return f\"(({self._print("),  # what the printer writes
])
def test_a_change_of_code_changes_the_key(tmp_path, old, new):
    assert old in SYMBOLIC
    assert (_fingerprint(tmp_path, SYMBOLIC.replace(old, new, 1))
            != _fingerprint(tmp_path, SYMBOLIC))


def test_docstrings_with_non_ascii_text_are_cut_at_the_right_place():
    # ast counts columns in UTF-8 bytes, the text in characters
    src = 'def f():\n    "ratio π ≤ 1"; x = 1\n    return x  # é\n'
    assert code_text(src) == "def f(): ; x = 1 return x"


def test_strings_that_are_not_docstrings_stay():
    src = 'x = "# not a comment"\ndef g():\n    y = 1\n    "not a docstring"\n'
    assert code_text(src) == 'x = "# not a comment" def g(): y = 1 "not a docstring"'


def test_the_derivation_and_table_keys_use_the_code_fingerprint():
    want = code_fingerprint([Path(symbolic.__file__), Path(_derived._stable.__file__)],
                            str(_derived.FORMAT), _derived.sp.__version__)
    assert _derived._code_hash() == want
    here = Path(store.__file__).resolve().parent
    assert store._code_hash() == code_fingerprint([here / n for n in store._BUILDERS],
                                                  store.np.__version__)


def test_a_files_digest_is_remembered_by_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    fingerprint._MEMO.clear()
    raw = SYMBOLIC.encode()
    want = fingerprint.code_digest(raw)
    assert len(list((tmp_path / "cache" / "fingerprint").iterdir())) == 1
    # a new process (empty memo) reads it from the cache, without tokenising
    fingerprint._MEMO.clear()
    monkeypatch.setattr(fingerprint, "code_text", lambda _text: pytest.fail("recomputed"))
    assert fingerprint.code_digest(raw) == want
    # other bytes are another entry, never the stored one
    monkeypatch.undo()
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    fingerprint._MEMO.clear()
    assert fingerprint.code_digest(raw + b"X = 1\n") != want


def test_a_damaged_memo_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    fingerprint._MEMO.clear()
    raw = SYMBOLIC.encode()
    want = fingerprint.code_digest(raw)
    (entry,) = (tmp_path / "cache" / "fingerprint").iterdir()
    entry.write_text(entry.read_text().replace(want, "0" * 64))  # its checksum no longer fits
    fingerprint._MEMO.clear()
    assert fingerprint.code_digest(raw) == want
