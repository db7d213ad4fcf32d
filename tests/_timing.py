"""A bound on how long a call may take: a hang guard for fuzz tests, not a speed goal."""

from __future__ import annotations

import contextlib
import signal


class Hang(AssertionError):
    """The body ran longer than its limit."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fail with :class:`Hang` when the body runs longer than ``seconds`` (SIGALRM, so the
    main thread of a POSIX process only).  Hypothesis' own deadline measures too finely for
    a loaded machine, where a first compilation alone may take tens of seconds."""

    def alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
