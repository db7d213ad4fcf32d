"""One-line notices of slow first-time work (compiling numba kernels), on the ``fbands``
logger.

A notice is an INFO record of the logger ``"fbands"``.  When the application has set up
logging (a handler on that logger or above it, as :func:`logging.basicConfig` adds), the
record goes there and the application's levels decide; when it has not, the notice is
printed on stderr as ``fbands: ...``, so that a plain script or the command line shows why
its first call takes seconds.  Silence it with
``logging.getLogger("fbands").setLevel(logging.WARNING)`` or the environment variable
``FBANDS_QUIET=1``.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["LOGGER", "notice"]

LOGGER = logging.getLogger("fbands")


def quiet() -> bool:
    """Whether ``FBANDS_QUIET`` asks for no notices (set, and not ``0`` or empty)."""
    return os.environ.get("FBANDS_QUIET", "").strip() not in ("", "0")


def notice(message: str) -> None:
    """Tell the user about ``message`` (one line) as described in the module's docstring."""
    if quiet():
        return
    if LOGGER.hasHandlers():
        LOGGER.info(message)  # the application's logging decides
        return
    if LOGGER.level != logging.NOTSET and not LOGGER.isEnabledFor(logging.INFO):
        return  # silenced: setLevel(logging.WARNING) or above
    try:  # no logging set up: logging's own formatting, on stderr (what a user sees)
        record = LOGGER.makeRecord(LOGGER.name, logging.INFO, "(fbands)", 0, message, (), None)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fbands: %(message)s"))
        handler.handle(record)
    except Exception:  # a notice must never break a computation
        pass
