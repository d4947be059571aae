"""Decisions taken on the control database bind every target: a hold placed mid-run protects
its rows on the target from the next chunk on, and waits for the gate's window in flight,
not for the leases of the worker processes draining it; the kill switch stops a target's run. The gate
costs the control database transactions per lease, not per chunk."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from retention import actions as policy_actions
from runs.actions import set_kill_switch
from runs.engine import planner, worker
from runs.engine.worker import drain
from runs.models import AuditRecord, Run
from targets import connections as C
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.fleet.control_load import ControlTransactions
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import manage_in_background, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _tenant_rows(tenant: int) -> set[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_events WHERE tenant_id = %s", [tenant])
        return {r[0] for r in cur.fetchall()}


def _eligible_rows(tenant: str, cutoff) -> int:
    """Rows of ``tenant`` the run would delete but for a hold (on the database in place)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM public.rr_events WHERE tenant_id::text = %s"
            " AND occurred_at < %s AND status <> 'disputed'",
            [tenant, cutoff],
        )
        return cur.fetchone()[0]


def test_a_hold_placed_mid_run_protects_its_rows_on_the_target(fleet, make_user, act_as, no_guard):
    target = fleet[0].name
    with C.on(target):
        create_events(20000, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[target], chunking="tenant", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    with C.on(target):
        run = Run.objects.get(run_key=key)
        planner.plan(run)
        while not AuditRecord.objects.exists():  # one chunk, not the whole run
            worker.process_one(Run.objects.get(pk=run.pk))
        partial = AuditRecord.objects.count()
        assert 0 < partial
        assert Run.objects.get(pk=run.pk).state == Run.State.ACTIVE
        held_before = _tenant_rows(2)

    policy_actions.place_hold(
        actor=make_user("hilde", "compliance"), reason="subpoena", policy=policy, tenant="2"
    )
    run_cli("drain", "--until-idle")
    with C.on(target):
        assert Run.objects.get(pk=run.pk).state == Run.State.DRAINED
        assert AuditRecord.objects.count() > partial
        # not one row of tenant 2 went after the hold committed on the control database
        assert _tenant_rows(2) == held_before


def test_the_kill_switch_stops_a_targets_run(fleet, make_user, act_as, no_guard):
    target = fleet[1].name
    with C.on(target):
        create_events(1000, days=40)
    approved_policy(make_user, **events_spec(targets=[target], chunk_size=100))
    oncall = make_user("olga", "oncall")
    act_as(oncall)
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    set_kill_switch(True, actor=oncall, reason="incident")
    with C.on(target):
        stats = drain(Run.objects.get(run_key=key).pk, budget_s=5, until_idle=True)
        assert "kill switch" in stats["stopped"]
        assert not AuditRecord.objects.exists()
    set_kill_switch(False, actor=oncall, reason="resolved")
    run_cli("drain", "--until-idle")
    with C.on(target):
        assert AuditRecord.objects.exists()
        assert Run.objects.get(run_key=key).state == Run.State.DRAINED


def test_a_scheduled_firing_creates_the_run_on_each_target(fleet, make_user, no_guard):
    from runs import tasks

    for target in fleet[:2]:
        with C.on(target.name):
            create_events(300, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[fleet[0].name, fleet[1].name], chunk_size=100)
    )
    from django.utils import timezone

    outcome = tasks.trigger_scheduled(policy_id=policy.pk, tick=timezone.now().isoformat())
    assert f"created run {fleet[0].name}:events/" in outcome
    assert f"created run {fleet[1].name}:events/" in outcome
    assert not Run.objects.exists()  # none on the control database
    for target in fleet[:2]:
        with C.on(target.name):
            assert Run.objects.count() == 1


SCHEMA = "retention_runner"
WINDOW_S = 1.0  # the gate's window in the worker processes (the default)


def _drain_process(*args: str, window_s: float = WINDOW_S):
    return manage_in_background(
        "retention", "drain", "--until-idle", *args,
        env={"RETENTION_GUARD": "0", "RETENTION_GATE_WINDOW_S": str(window_s)}, timeout=240,
    )  # fmt: skip


def _finish(worker) -> None:
    done = worker.result()
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_hold_placed_while_worker_processes_drain_a_target_protects_its_rows_within_a_window(
    fleet, make_user, act_as
):
    target = fleet[0]
    with C.on(target.name):
        create_events(20000, days=40)
    # paced, so that the run lasts well past the hold: two worker processes, one chunk per
    # tenant at once
    policy = approved_policy(
        make_user,
        **events_spec(
            targets=[target.name], chunking="tenant", chunk_size=100, pace_rows_per_s=600
        ),
    )
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    _plan_whole(target, key)  # the workers' only waits are their pace and the gate
    workers = [_drain_process("--workers", "1") for _ in range(2)]
    try:
        records = f"SELECT count(*) FROM {SCHEMA}.runs_auditrecord"
        wait_for(lambda: target.scalar(records) >= 4, timeout=120, what="the first chunks")
        # the tenant with the most chunks still to go
        tenant = target.scalar(
            f"SELECT tenant FROM {SCHEMA}.runs_chunk WHERE state = 'pending'"
            " GROUP BY tenant ORDER BY count(*) DESC, tenant LIMIT 1"
        )
        policy_actions.place_hold(
            actor=make_user("hilde", "compliance"), reason="subpoena", policy=policy, tenant=tenant
        )
        with target.connect() as conn:
            # chunks of other tenants still to go when the hold committed: it waited for the
            # window in flight, not for the workers' leases (which last until the run ends)
            still_pending = conn.execute(
                f"SELECT count(*) FROM {SCHEMA}.runs_chunk WHERE state = 'pending'"
                " AND tenant <> %s",
                [tenant],
            ).fetchone()[0]
            held = {
                r[0]
                for r in conn.execute(
                    "SELECT id FROM public.rr_events WHERE tenant_id::text = %s", [tenant]
                )
            }
            going = conn.execute(f"SELECT state FROM {SCHEMA}.runs_run").fetchone()[0]
    finally:
        for worker in workers:
            _finish(worker)

    assert going == "active"  # the hold met the run mid-way
    with C.on(target.name):
        run = Run.objects.get()
        assert run.state == Run.State.DRAINED
        # not one row of the tenant went after the hold committed on the control database,
        # and rows the run would have deleted are still there
        assert _tenant_rows(int(tenant)) == held
        assert _eligible_rows(tenant, run.cutoff) > 0
    assert still_pending > 0


def _planned_run(target, slug: str, chunk_size: int, make_user) -> int:
    """A run of policy ``slug`` on ``target``, planned whole here: its chunks are fixed before
    the drain (no chunk size adapts)."""
    approved_policy(
        make_user,
        **events_spec(slug, targets=[target.name], chunking="key", chunk_size=chunk_size),
    )
    (key,) = run_cli("trigger", slug, "--period", NOW.date().isoformat()).split()
    return _plan_whole(target, key)


def _plan_whole(target, key: str) -> int:
    """Plan run ``key`` on ``target`` whole; its number of chunks."""
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        while not run.planner_done:
            planner.plan(run, window=10_000)
            run.refresh_from_db()
        return run.chunks.count()


def test_the_control_database_commits_per_lease_not_per_chunk(fleet, make_user, act_as):
    """The same rows drained in 20 and in 80 chunks by a worker process cost the control
    database the same transactions, within a constant: the gate's fences and generation are
    taken once per window, and nothing else the drain does on a target goes to the control
    database per chunk. The window and a run's budget per round are set longer than the drains
    here, so that the count is the lease's alone whatever the machine's speed (with the default
    second, a lease's count grows with its seconds, never with its chunks; each round of the
    drain over the targets reads each target's connection string)."""
    a, b = fleet[0], fleet[1]
    for target in (a, b):
        with C.on(target.name):
            create_events(4000, days=40)
    act_as(make_user("olga", "oncall"))
    counter = ControlTransactions()
    try:
        costs, chunks = {}, {}
        for target, slug, size in ((a, "coarse", 100), (b, "fine", 25)):
            chunks[slug] = _planned_run(target, slug, size, make_user)
            C.close_all()
            connections.close_all()  # this process's sessions: their counts are in, or none
            before = counter.read()
            _finish(_drain_process("--workers", "1", "--budget", "600", window_s=60))
            costs[slug] = counter.read() - before
            with C.on(target.name):
                assert Run.objects.get().state == Run.State.DRAINED
                assert AuditRecord.objects.count() == chunks[slug]
    finally:
        counter.close()
    assert 18 <= chunks["coarse"] <= 22 and 72 <= chunks["fine"] <= 88, chunks
    assert costs["coarse"] > 0, costs
    # 60 more chunks: the per-chunk gate committed at least one control transaction per chunk
    assert costs["fine"] - costs["coarse"] <= 6, (costs, chunks)


def test_a_window_whose_control_session_ended_is_not_trusted_for_the_next_chunk(
    fleet, make_user, act_as, no_guard, settings
):
    """The server ends the window's control session between two chunks (its fences go with
    it) and a hold commits at once: the lease's next chunk opens a new window, which reads
    the hold, rather than trusting the old one."""
    from runs.fleet import mirror
    from tests.runs.processes import pg_connect

    settings.RETENTION = {**settings.RETENTION, "GATE_WINDOW_S": 60}
    target = fleet[0].name
    with C.on(target):
        create_events(6000, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[target], chunking="tenant", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    _plan_whole(fleet[0], key)
    hilde = make_user("hilde", "compliance")

    def hold(tenant: str) -> None:
        try:
            policy_actions.place_hold(actor=hilde, reason="subpoena", policy=policy, tenant=tenant)
        finally:
            connection.close()

    admin = pg_connect()  # a session of the control database's own
    with admin, C.on(target), mirror.lease():
        run = Run.objects.get(run_key=key)
        while not AuditRecord.objects.exists():
            worker.process_one(Run.objects.get(pk=run.pk))
        with C.on("default"), connection.cursor() as cur:  # the window's session
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        tenant = (
            run.chunks.filter(state="pending").values_list("tenant", flat=True).order_by("-id")[0]
        )
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        wait_for(
            lambda: (
                not admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()[0]
            ),
            what="the window's session to end",
        )
        placing = threading.Thread(target=hold, args=(tenant,), daemon=True)
        placing.start()
        placing.join(60)  # nothing holds the fences now
        assert not placing.is_alive(), "the hold waited for the ended session's fences"
        held = _tenant_rows(int(tenant))
        for _ in range(200):
            outcome = worker.process_one(Run.objects.get(pk=run.pk))
            if outcome.kind == worker.NO_WORK:
                break
        assert _tenant_rows(int(tenant)) == held
        assert outcome.kind == worker.NO_WORK  # the run's chunks all went, the held rows stayed
        assert _eligible_rows(tenant, run.cutoff) > 0
