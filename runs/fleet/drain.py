"""``retention drain`` over every target: each worker visits the control database and the
targets in turn, round after round, and on each drains what is admissible there now (a round
of the database's active runs), then moves on to the next — so a target whose runs are
throttled, or whose chunks are all in other workers' hands, never holds a worker while another
target has work. When a whole round found nothing admissible anywhere the worker waits a
moment (for the runs it saw active) and looks again; it ends when a round finds no active run
on any target. A target that does not answer (or stops answering mid-run) is noted on its
registry row — its runs then show ``attention`` naming it — and left out of the worker's
rounds; the next drain resumes its runs where their ledger says they are."""

from __future__ import annotations

from collections.abc import Callable

from django.db import DatabaseError, InterfaceError

from targets import connections as C
from targets.models import DEFAULT

COUNTERS = ("chunks", "rows", "failed")


def rotation(names: list[str], worker: int) -> list[str]:
    """The order a worker visits ``names`` in: the control database first, then the targets,
    each worker starting at a different one than the worker before it."""
    others = [n for n in names if n != DEFAULT]
    if others:
        shift = worker % len(others)
        others = others[shift:] + others[:shift]
    return ([DEFAULT] if DEFAULT in names else []) + others


def drain_everywhere(
    names: list[str],
    drain_round: Callable[[], dict],
    wait: Callable[[list[int], float], object],
    *,
    worker: int = 0,
    until_idle: bool = True,
    idle_s: float = 0.5,
) -> dict:
    """Rounds of ``drain_round`` (one round on the database in place: its counters and
    ``active``, the ids of the runs it found active) over ``names``, in ``rotation``; with
    ``until_idle`` until a round finds no active run anywhere, otherwise one round. A round
    that committed no chunk anywhere is followed by ``wait(ids, seconds)`` on each database
    with active runs, ``idle_s`` shared among them. Returns the summed counters and
    ``unreachable``: the targets that failed, each with its reason."""
    total: dict = {k: 0 for k in COUNTERS}
    total["unreachable"] = {}
    order = rotation(names, worker)
    answered: set[str] = set()

    def on(name: str, func: Callable[[], object]) -> tuple[bool, object]:
        """``func`` on ``name``; (False, None) when the target does not answer (noted, and
        left out of the rounds from now on)."""
        if name == DEFAULT:
            return True, func()
        try:
            with C.on(name):
                result = func()
        except (DatabaseError, InterfaceError, C.TargetError) as exc:
            C.close_all()
            if not isinstance(exc, C.TargetError):
                C.note_reachable(name, exc)
            total["unreachable"][name] = C.first_line(exc)
            order.remove(name)
            return False, None
        if name not in answered:
            answered.add(name)
            C.note_reachable(name, None)
        return True, result

    try:
        while order:
            progressed = False
            active: dict[str, list[int]] = {}
            for name in list(order):
                ok, stats = on(name, drain_round)
                if not ok:
                    continue
                for k in COUNTERS:
                    total[k] += stats[k]
                progressed |= bool(stats["chunks"])
                if stats["active"]:
                    active[name] = stats["active"]
            if not until_idle or not active:
                break
            if not progressed:
                # nothing admissible anywhere: wait for the runs seen active, no longer than
                # they stay so (another worker may end them), then the next round looks again
                # at every active run, a waiting run admitted meanwhile included
                share = idle_s / len(active)
                for name, ids in active.items():
                    if name in order:
                        on(name, lambda ids=ids, share=share: wait(ids, share))
    finally:
        C.close_all()
    return total
