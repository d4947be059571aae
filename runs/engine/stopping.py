"""Whether the django-q2 worker this code runs in is being stopped.

SIGTERM reaches only the main ``qcluster`` process (a supervisor must signal it alone); it
sets the cluster's stop event, which every process of the cluster shares. django-q2 forks its
workers from the sentinel that holds that event, so a worker finds it on its own stack. A
lease checks it at every chunk boundary and ends there; a lease message that was already
pushed to a stopping worker ends before its first chunk. Outside a cluster (tests, commands)
nothing is ever stopping.
"""

from __future__ import annotations

import os
import sys
import time

from django_q.cluster import Sentinel

_found: tuple[int, object | None] | None = None  # (pid, stop event) — re-read after a fork


def _stop_event():
    global _found
    if _found is not None and _found[0] == os.getpid():
        return _found[1]
    event = None
    frame = sys._getframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Sentinel):
            event = owner.stop_event
            break
        frame = frame.f_back
    _found = (os.getpid(), event)
    return event


def requested() -> bool:
    """True once the cluster this worker belongs to has been asked to stop."""
    event = _stop_event()
    return bool(event is not None and event.is_set())


def sleep(seconds: float) -> bool:
    """Sleep up to ``seconds``, waking at once when a stop is requested; True if it was."""
    if seconds <= 0:
        return requested()
    event = _stop_event()
    if event is None:
        time.sleep(seconds)
        return False
    return event.wait(seconds)
