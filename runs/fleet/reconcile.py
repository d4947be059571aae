"""The reconciler over every target: the control database's pass, then one pass per target
on its own ledger (``runs.engine.reconciler.reconcile`` inside ``targets.connections.on``) —
its stale leases re-published, its finished runs verified, its waiting runs started, its
missed period caught up and its superseded period run again, its own tables pruned.

Each target's pass is its own failure domain: a target that does not answer (or lacks the
ledger) is noted on its registry row and skipped, and the others go on. All the passes share
one budget, half the task timeout, the targets in a fresh random order each time, so a slow
target never starves the same others twice; the mirror of the decisions is brought to the
control database's generation before a target's pass (synced only when it is behind), so its
kill switch, pauses, versions and holds are the control database's."""

from __future__ import annotations

import random

from django.db import DatabaseError, InterfaceError, connection
from django.utils import timezone

from retention.models import KillSwitch
from runs.engine import reconciler
from runs.fleet import mirror
from targets import connections as C
from targets.models import DEFAULT


def reconcile_everywhere(now=None) -> dict:
    """The control database's pass, with ``targets``: each registered target's report (only
    what it did), or ``{"unreachable": why}``, ``{"skipped": why}``, ``{"deferred": ...}``."""
    now = now or timezone.now()
    budget = reconciler.pass_budget()
    kill = KillSwitch.is_on()
    report = reconciler.reconcile(now, budget=budget, kill=kill)
    others = [name for name in C.all_names() if name != DEFAULT]
    random.shuffle(others)
    report["targets"] = {}
    try:
        for name in others:
            if budget.stopping():
                report["stopped"] = True
                break
            if not budget.fits():
                report["targets"][name] = {"deferred": "the pass's time is spent"}
                continue
            report["targets"][name] = reconcile_target(name, now, budget=budget, kill=kill)
    finally:
        C.close_all()
    return report


def reconcile_target(name: str, now, *, budget: reconciler.PassBudget, kill: bool) -> dict:
    """One pass over target ``name``'s ledger; what it did (its non-empty entries), or why
    it did not run there."""
    control_generation = mirror.control_generation()
    try:
        with C.on(name):
            if not C.has_ledger():
                return {"skipped": f"target {name} has no ledger (retention target migrate {name})"}
            if _read_only():  # a replica after a fail-over: nothing here can be repaired now
                return {"unreachable": f"target {name} is read-only: it accepts no writes"}
            behind = mirror.control_generation() != control_generation
        if behind:  # the mirror's rows and its generation are written in one transaction
            mirror.sync(name)
        with C.on(name):
            done = reconciler.reconcile(now, budget=budget, kill=kill)
    except C.TargetError as exc:
        return {"unreachable": str(exc)}
    except (DatabaseError, InterfaceError) as exc:
        C.close_all()  # a broken session is not reused by the next target's pass
        C.note_reachable(name, exc)
        return {"unreachable": C.why_unusable(exc)}
    if not done["failed"]:
        C.note_reachable(name, None)
    return {k: v for k, v in done.items() if v}


def _read_only() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('transaction_read_only') = 'on'")
        return bool(cur.fetchone()[0])
