"""``retention drain`` over every target: each worker drains the control database's runs and
then each target's, starting at a different target than the worker before it. A target that
does not answer (or stops answering mid-run) is noted on its registry row — its runs then show
``attention`` naming it — and the worker goes on with the others; the next drain resumes its
runs where their ledger says they are."""

from __future__ import annotations

from collections.abc import Callable

from django.db import DatabaseError, InterfaceError

from targets import connections as C
from targets.models import DEFAULT

COUNTERS = ("chunks", "rows", "failed")


def drain_everywhere(names: list[str], drain_here: Callable[[], dict], *, worker: int = 0) -> dict:
    """``drain_here`` (one target's drain, until idle) on each of ``names``, the control
    database first; returns the summed counters and ``unreachable``: the targets that failed."""
    total: dict = {k: 0 for k in COUNTERS}
    total["unreachable"] = {}
    others = [n for n in names if n != DEFAULT]
    if others:
        shift = worker % len(others)
        others = others[shift:] + others[:shift]
    order = ([DEFAULT] if DEFAULT in names else []) + others
    for name in order:
        if name == DEFAULT:
            stats = drain_here()
        else:
            try:
                with C.on(name):
                    stats = drain_here()
            except (DatabaseError, InterfaceError, C.TargetError) as exc:
                C.close_all()
                if not isinstance(exc, C.TargetError):
                    C.note_reachable(name, exc)
                total["unreachable"][name] = C.first_line(exc)
                continue
            C.note_reachable(name, None)
        for k in COUNTERS:
            total[k] += stats[k]
    C.close_all()
    return total
