"""A run's folder: one process at a time, and what a resumed run keeps of its metrics.

:func:`claim` holds an exclusive lock on the folder while a run writes there, so that a
second ``fbands train`` started on the same ``run_dir`` (at the same moment, or while the
first still runs) is refused instead of interleaving its metrics with the first's and
overwriting its checkpoint.  The lock is the kernel's (``flock`` on the folder itself): no
lock file is left behind, and a run killed with ``kill -9`` holds nothing afterwards.

:func:`keep_metrics` cuts ``metrics.jsonl`` back to the steps of the checkpoint a run
resumes from.  Only its last line may be damaged (a kill in the middle of a write); any
other line that is not a metrics row stops the resume with a :class:`ConfigError` naming
it, since rewriting the file would lose it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from fbands.errors import ConfigError

__all__ = ["claim", "keep_metrics", "regular_or_absent"]


@contextlib.contextmanager
def claim(run_dir: Path, *, create: bool, log=None) -> Iterator[None]:
    """Hold ``run_dir`` for this run (created first when ``create``); a
    :class:`ConfigError` when another process holds it.  A folder that does not exist (and
    is not to be created) is not held: the run finds nothing to resume there."""
    if create:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"run_dir={str(run_dir)!r} cannot be created: {err}") from err
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        if create:
            raise ConfigError(f"run_dir={str(run_dir)!r} cannot be opened") from None
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # a file system without
                if log is not None:                                 # locks (some NFS)
                    log(f"run_dir={str(run_dir)!r}: cannot lock it ({err.strerror}); make "
                        "sure no other run writes there")
            else:
                raise ConfigError(
                    f"run_dir={str(run_dir)!r} is in use by another fbands train running "
                    "now; two runs in one folder would mix their metrics and overwrite each "
                    "other's checkpoint: wait for it to end, or choose another run_dir"
                ) from None
        yield
    finally:
        os.close(fd)  # (releases the lock)


def regular_or_absent(path: Path, what: str) -> bool:
    """Whether ``path`` is a regular file (True) or absent (False): anything else there, a
    folder or a link that leads nowhere (an unmounted volume), is a :class:`ConfigError`,
    never taken for "absent" (that would start the run again over its files)."""
    if path.is_file():
        return True
    if not os.path.lexists(path):
        return False
    kind = "a link that leads nowhere" if path.is_symlink() else (
        "a folder" if path.is_dir() else "not a regular file")
    raise ConfigError(f"{what} {str(path)!r} is {kind}: fix or remove it (a volume not "
                      "mounted?), then run again")


def _step(line: bytes) -> int | None:
    """The step of a metrics row (None: the line is not one)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    step = row.get("step") if isinstance(row, dict) else None
    ok = isinstance(step, int) and not isinstance(step, bool) and step >= 1
    return step if ok else None


def keep_metrics(path: Path, step: int) -> None:
    """Keep the rows of ``metrics.jsonl`` up to ``step``, atomically (a kill meanwhile
    keeps them all).  The last line is dropped when it is not a row (a write cut short);
    any other line that is not a row is a :class:`ConfigError` that names it."""
    if not regular_or_absent(path, "metrics file"):
        return
    try:
        lines = path.read_bytes().splitlines()
    except OSError as err:
        raise ConfigError(f"metrics file {str(path)!r} cannot be read: {err}") from err
    kept = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        logged = _step(line)
        if logged is None and number < len(lines):
            shown = line[:80].decode("utf-8", "backslashreplace")
            raise ConfigError(f"metrics file {str(path)!r}, line {number}, is not a metrics row "
                              f"with a step ({shown!r}): repair or remove that line, then "
                              "resume again")
        if logged is not None and logged <= step:
            kept.append(line + b"\n")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"metrics file {str(path)!r} cannot be rewritten: {err}") from err
