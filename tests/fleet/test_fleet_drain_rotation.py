"""``retention drain --until-idle --workers 1`` over two targets, the first of which its worker
visits is throttled (a lock on its table, which its guard reads): the worker does not wait on
it — it drains the free target whole while the lock is held, then the first once it is gone."""

from __future__ import annotations

import signal

import pytest

from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, Chunk, Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.fleet.test_fleet_ceilings import LOCK_REASON, _lock_table
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import kill_group, spawn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 3000
SCHEMA = "retention_runner"


def _state(target) -> str:
    return target.scalar(f"SELECT state FROM {SCHEMA}.runs_run")


def _eligible(target, cutoff) -> int:
    return target.scalar(
        "SELECT count(*) FROM public.rr_events WHERE occurred_at < %s AND status <> 'disputed'",
        [cutoff],
    )


def test_one_drain_worker_drains_a_free_target_while_the_other_targets_table_is_locked(
    fleet, make_user, act_as
):
    locked, free = fleet[0], fleet[1]  # the worker visits ``locked`` first (rotation order)
    Target.objects.filter(name__in=[locked.name, free.name]).update(group="pair")
    for target in (locked, free):
        with C.on(target.name):
            create_events(ROWS, days=40)
    approved_policy(
        make_user, **events_spec(targets=["group:pair"], chunking="key", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert [k.split(":")[0] for k in keys] == [locked.name, free.name]
    cutoffs = {}
    for target in (locked, free):
        with C.on(target.name):
            cutoffs[target.name] = Run.objects.get().cutoff
    expected = {t.name: _eligible(t, cutoffs[t.name]) for t in (locked, free)}
    records = f"SELECT count(*) FROM {SCHEMA}.runs_auditrecord"

    locker = _lock_table(locked)
    held_from = locker.execute("SELECT clock_timestamp()").fetchone()[0]
    worker = spawn("retention", "drain", "--until-idle", "--workers", "1")
    try:
        wait_for(
            lambda: _state(free) == "drained" or worker.poll() is not None,
            timeout=240,
            interval=0.2,
            what=lambda: f"the free target drained ({_state(free)}) while the other is locked",
        )
        assert worker.poll() is None, worker.stderr.read()[-2000:]
        # the locked target's chunks were refused for its lock, none committed; it was visited
        assert locked.scalar(records) == 0
        assert _state(locked) == "active"
        with locked.connect() as conn:
            reasons = {
                r[0]
                for r in conn.execute(f"SELECT DISTINCT throttle_reason FROM {SCHEMA}.runs_chunk")
            }
        assert any(LOCK_REASON in r for r in reasons), reasons
        held_until = locker.execute("SELECT clock_timestamp()").fetchone()[0]
        locker.close()
        locker = None
        worker.wait(timeout=240)
    finally:
        if locker is not None:
            locker.close()
        kill_group(worker, signal.SIGKILL)
    assert worker.returncode == 0, worker.stderr.read()[-2000:]

    spans = {}
    for target in (locked, free):
        assert _state(target) == "drained"
        assert _eligible(target, cutoffs[target.name]) == 0
        with C.on(target.name):
            spans[target.name] = list(
                AuditRecord.objects.values_list("started_at", "committed_at", "rows_deleted")
            )
            assert not Chunk.objects.exclude(state=Chunk.State.DONE).exists()
            assert not verify_chain().problems
        assert sum(r[-1] for r in spans[target.name]) == expected[target.name] > 0
    # the free target drained whole while the lock was held; the locked one only after it
    assert all(held_from <= s and e <= held_until for s, e, _ in spans[free.name])
    assert all(s >= held_until for s, _, _ in spans[locked.name])
