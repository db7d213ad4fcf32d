"""A divergence's numba package follows its code, not its words (issue 39).

The package's folder name and the bytes of its copies are what keep numba's on-disk cache
of the kernels valid: a reworded comment or docstring in the compiled modules or in the
modules they import must change neither, and an edit of the code must change the name.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("numba")

import fbands  # noqa: E402
from fbands._jit import loader  # noqa: E402


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """Copies of the compiled modules and their dependencies that a test may edit."""
    for name in loader.COMPILED:
        shutil.copy(loader._HERE / f"{name}.py", tmp_path / f"{name}.py")
    depends = []
    for path in loader._DEPENDS:
        shutil.copy(path, tmp_path / path.name)
        depends.append(tmp_path / path.name)
    monkeypatch.setattr(loader, "_HERE", tmp_path)
    monkeypatch.setattr(loader, "_DEPENDS", tuple(depends))
    loader._BARE.clear()
    yield tmp_path
    loader._BARE.clear()


def _package(div):
    loader._BARE.clear()
    files = loader.package_files(div)
    return loader._package_name(div, files), files


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_words_change_neither_the_name_nor_the_copies(sources):
    kl = fbands.get("kl")
    name, files = _package(kl)
    scalar = sources / "scalar.py"
    _edit(scalar, '"""', '"""Reworded for a test.\n\n')  # the module docstring
    _edit(scalar, "\ndef ", "\n# a new comment line\n\ndef ")
    solver = sources / "_solver.py"
    _edit(solver, '"""', '"""Another word. ')
    assert _package(kl) == (name, files)


@pytest.mark.parametrize("where", ["scalar.py", "_solver.py"])
def test_an_edit_of_the_code_changes_the_name(sources, where):
    kl = fbands.get("kl")
    name, _ = _package(kl)
    with open(sources / where, "a") as f:
        f.write("\n_TEST_CONSTANT = 1\n")
    assert _package(kl)[0] != name


def test_the_copies_hold_no_words_and_the_same_definitions(sources):
    import ast
    import io
    import tokenize

    files = loader.package_files(fbands.get("kl"))
    for name in loader.COMPILED:
        original = ast.parse((sources / f"{name}.py").read_text())
        copy = files[f"{name}.py"].decode()
        tokens = tokenize.generate_tokens(io.StringIO(copy).readline)
        assert not [t for t in tokens if t.type == tokenize.COMMENT]
        tree = ast.parse(copy)
        assert ast.get_docstring(tree) is None
        defs = {n.name for n in ast.walk(original) if isinstance(n, ast.FunctionDef)}
        assert defs and defs == {n.name for n in ast.walk(tree)
                                 if isinstance(n, ast.FunctionDef)}
