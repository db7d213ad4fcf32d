"""The one safe-file helper of every cache: a private directory, verified reads, atomic writes.

Root: ``FBANDS_CACHE_DIR``, else ``~/.cache/fbands``.  A subdirectory is used only if it is a
real directory (not a link) owned by this user that no one else can write (it is created with
mode 0700, and tightened to it when others can only read it), under directories that no
other user can write, not even through a shared group (the path is resolved first, so a link
flipped meanwhile changes nothing); otherwise :func:`private_dir` returns None and the
caller computes instead of caching (or, for files that must exist, uses
:func:`process_dir`).  A file holds
``{"key", "sha256", "data"}``: it is read only when its key is the one asked for and the hash
of its data matches, so a damaged, truncated or misplaced file is ignored, never trusted.
Nothing is pickled here (numba's own cache files are pickles: they go only to such a
directory, :func:`folder`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from fbands._state import STATE

__all__ = ["root", "private_dir", "folder", "process_dir", "read_file", "holds", "write_file",
           "read_json", "write_json"]

#: Files larger than this are not read (a cache entry is a few kB).
MAX_BYTES = 1 << 24


def root() -> Path:
    """``FBANDS_CACHE_DIR``, else ``~/.cache/fbands``."""
    env = os.environ.get("FBANDS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fbands"


def private_dir(name: str, base: Path | None = None) -> Path | None:
    """``base / name`` (``base``: :func:`root` by default), created if needed, when it is
    private to this user; else None.

    The path returned is the real one (links above it resolved), and no one else can
    rename or replace any directory on it: each is owned by this user or root and
    writable by no other user (group members included, unless the sticky bit is set or
    the group is this user's alone), and ``name`` itself is no link.  So what is checked
    here is what is later opened, however the links that led to it change meanwhile."""
    path = (root() if base is None else Path(base)) / name
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = Path(os.path.realpath(path.parent)) / name
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        if st.st_mode & 0o022:  # others could have written there: nothing in it is trusted
            return None
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        if not os.access(path, os.W_OK | os.X_OK) or not _parents_safe(path):
            return None
    except OSError:
        return None
    return path


def _parents_safe(path: Path) -> bool:
    """Whether no other user can replace ``path`` (a real path) through a directory above
    it: each is owned by this user or root, and writable by other users (the group's
    members or anyone) only with the sticky bit (``/tmp``)."""
    for parent in path.parents:
        st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (os.getuid(), 0):
            return False
        if st.st_mode & stat.S_ISVTX:
            continue
        if st.st_mode & 0o002 or (st.st_mode & 0o020 and not _own_group(st.st_gid)):
            return False
    return True


def _own_group(gid: int) -> bool:
    """Whether group ``gid`` has no member but this user (a user-private group)."""
    return _GROUPS.get_or_make(gid, lambda: _private_group(gid))


_GROUPS = STATE.memo("private groups", "whether each group id met is a user-private group")


def _private_group(gid: int) -> bool:
    import grp
    import pwd

    uid = os.getuid()
    try:
        group, me = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
        users = pwd.getpwall()
    except (KeyError, OSError):
        return False
    return (all(m == me for m in group.gr_mem)
            and all(u.pw_uid == uid for u in users if u.pw_gid == gid))


def folder(name: str, base: Path | None = None) -> Path:
    """:func:`private_dir`, or ``name`` in this process's own directory (:func:`process_dir`)
    when that is not safe to use: for files that must exist, and that nobody else may have
    put there (numba's cache files, which it loads with pickle; converted models)."""
    path = private_dir(name, base)
    if path is None:
        path = process_dir() / name
        path.mkdir(mode=0o700, exist_ok=True)
    return path


_PROCESS_DIR: Path | None = None
_PROCESS_LOCK = threading.Lock()


def process_dir() -> Path:
    """A private directory (:func:`tempfile.mkdtemp`: unique name, mode 0700) for this
    process alone, removed at exit: where files that must exist go when :func:`private_dir`
    refuses (nothing in it is reused by another process)."""
    global _PROCESS_DIR
    with _PROCESS_LOCK:
        if _PROCESS_DIR is None:
            _PROCESS_DIR = Path(tempfile.mkdtemp(prefix="fbands-"))
            atexit.register(shutil.rmtree, _PROCESS_DIR, ignore_errors=True)
        return _PROCESS_DIR


def _digest(data) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def read_file(path: Path, limit: int = MAX_BYTES) -> bytes | None:
    """The bytes of the regular file ``path`` owned by this user (a link is not followed),
    or None when it is missing, unreadable, another user's, not a regular file or longer
    than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return None
            raw = fh.read(limit + 1)
    except OSError:
        return None
    return raw if len(raw) <= limit else None


def holds(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) whose bytes are exactly ``data``."""
    return read_file(path, len(data)) == data


def write_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the whole new
    one, never half of it); False if it could not be written."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


def read_json(path: Path, key: str):
    """The data stored under ``key`` at ``path``, or None (missing, foreign or damaged)."""
    raw = read_file(path)
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict) or obj.get("key") != key:
            return None
        data = obj.get("data")
        return data if obj.get("sha256") == _digest(data) else None
    except (ValueError, TypeError, RecursionError):
        return None


def write_json(path: Path, key: str, data) -> bool:
    """Store ``data`` under ``key`` at ``path`` (atomically, :func:`write_file`); False if
    it could not be written."""
    text = json.dumps({"key": key, "sha256": _digest(data), "data": data}, sort_keys=True)
    return write_file(path, text.encode())
