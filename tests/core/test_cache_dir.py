"""Where fbands caches may live (fbands/_cache.py; issue 27, F1).

numba's cache files are pickles, so a directory another user can change is a way to run
code as this one: a group-writable parent (a shared team folder) is not trusted, and a link
on the way is resolved before anything is checked, so that flipping it later changes
nothing.
"""

from __future__ import annotations

import os
import pwd

import pytest

from fbands import _cache


def _other_users_group() -> int | None:
    """The primary group of some other user (a group that is not this user's alone)."""
    for user in pwd.getpwall():
        if user.pw_uid != os.getuid() and user.pw_gid != os.getgid():
            return user.pw_gid
    return None


def test_a_group_writable_parent_is_not_trusted(tmp_path, monkeypatch):
    gid = _other_users_group()
    if gid is None:
        pytest.skip("no other user's group on this machine")
    team = tmp_path / "team"
    team.mkdir()
    os.chown(team, -1, gid)
    os.chmod(team, 0o2775)  # a shared team folder: the group's members may rename in it
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(team / "cache"))
    assert _cache.private_dir("numba") is None
    assert _cache.folder("numba").parent == _cache.process_dir()  # this process's alone
    os.chmod(team, 0o3775)  # with the sticky bit, members can no longer rename others' files
    assert _cache.private_dir("numba") == team / "cache" / "numba"
    os.chmod(team, 0o755)
    assert _cache.private_dir("numba") == team / "cache" / "numba"


def test_a_link_on_the_way_is_resolved_before_the_checks(tmp_path, monkeypatch):
    real, fake = tmp_path / "real", tmp_path / "fake"
    real.mkdir()
    fake.mkdir()
    link = tmp_path / "cache"
    link.symlink_to(real)
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(link))
    got = _cache.private_dir("numba")
    assert got == real / "numba"
    link.unlink()
    link.symlink_to(fake)  # flipped after the check: what was returned still leads to real
    assert got.resolve() == real / "numba" and not (fake / "numba").exists()
    # a parent reached through a link into a group-writable folder is judged where it is
    gid = _other_users_group()
    if gid is not None:
        os.chown(fake, -1, gid)
        os.chmod(fake, 0o2775)
        assert _cache.private_dir("numba") is None


def test_the_folder_itself_may_not_be_a_link(tmp_path, monkeypatch):
    monkeypatch.setenv("FBANDS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache" / "numba").symlink_to(tmp_path / "elsewhere")
    assert _cache.private_dir("numba") is None
