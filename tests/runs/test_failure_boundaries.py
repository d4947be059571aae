"""Every row of the design's failure-boundary table, with real processes and real PostgreSQL.
After each, the invariant checker compares the table with its shadow copy and the audit trail."""

from __future__ import annotations

import io
import signal
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection

from runs.actions import trigger_run
from runs.engine import planner
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy, backdate_approval, events_spec
from tests.runs.conftest import NOW, count, create_events
from tests.runs.processes import (
    backends_running,
    backends_waiting_on_delete,
    kill_group,
    manage_at_once,
    pg_connect,
    spawn,
    wait_for,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SHADOW = ("public", "rr_events_shadow")


def make_policy(make_user, **overrides):
    return approved_policy(make_user, **events_spec(**overrides))


@pytest.fixture
def table(transactional_db):
    create_events(3000)
    yield "rr_events"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def drain_in_process(run: Run) -> str:
    """What is left of the run after the failure, drained by the command an operator runs,
    in this process: the failure itself is what the test makes happen in other processes."""
    out = io.StringIO()
    call_command("retention", "drain", run.run_key, "--until-idle", "--budget", "60", stdout=out)
    return out.getvalue()


def assert_converged(run: Run) -> None:
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=SHADOW) == []


def test_twenty_concurrent_triggers_create_one_run(table, make_user, act_as):
    make_policy(make_user)
    act_as(make_user("olga", "oncall"))
    done = manage_at_once(*[("retention", "trigger", "events", "--period", "2026-11-29")] * 20)
    keys = set()
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        keys.add(proc.stdout.strip())
    assert keys == {"events/2026-11-29T03:00"}
    assert Run.objects.count() == 1


def test_a_worker_killed_before_commit_leaves_rows_and_no_audit_row(table, make_user):
    policy = make_policy(make_user, timeouts={"lock_ms": 8000, "statement_ms": 10000})
    run, _ = trigger_run(policy, tick=NOW)
    before = count("rr_events")
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN SHARE MODE")  # DELETE must wait
    # guard off: this test needs the DELETE itself to be in flight, not refused for the lock
    worker = spawn("retention", "drain", run.run_key, "--until-idle", env={"RETENTION_GUARD": "0"})
    observer = pg_connect()
    try:
        wait_for(
            lambda: backends_waiting_on_delete(observer, "rr_events"),
            what="a DELETE waiting on the lock",
        )
        kill_group(worker, signal.SIGKILL)
    finally:
        blocker.rollback()
        blocker.close()
    # The orphaned backend runs its DELETE, cannot reach its client, and rolls back.
    wait_for(
        lambda: not backends_running(observer, "DELETE FROM%rr_events%"), what="the orphan to end"
    )
    observer.close()
    assert count("rr_events") == before
    assert AuditRecord.objects.count() == 0
    assert not Chunk.objects.filter(run=run, state=Chunk.State.DONE).exists()
    drain_in_process(run)
    assert_converged(run)


def test_ten_concurrent_deliveries_process_each_chunk_once(table, make_user):
    # chunks of 10 keys, 160 at most (16×): the ~1,500 keys before the cutoff are more chunks
    # than there are deliveries, however fast the size grows
    policy = make_policy(
        make_user, chunk_size=10, limits={"policy_workers": 4, "tenant_workers": 2}
    )
    run, _ = trigger_run(policy, tick=NOW)
    done = manage_at_once(
        *[("retention", "drain", run.run_key, "--until-idle", "--budget", "60")] * 10
    )
    for proc in done:
        assert proc.returncode == 0, proc.stderr
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert done > 10
    assert AuditRecord.objects.filter(run=run).count() == done
    assert_converged(run)


def test_the_same_chunk_claimed_twice_is_deleted_once(table, make_user):
    from runs.engine import worker

    policy = make_policy(make_user)
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    chunk = Chunk.objects.filter(run=run).order_by("seq", "id").first()
    results = []

    def deliver():
        from django.db import connection as conn

        try:
            results.append(worker.process_one(Run.objects.get(pk=run.pk), chunk_id=chunk.pk).kind)
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=10) as pool:
        for _ in range(10):
            pool.submit(deliver)
    assert results.count(worker.DONE) == 1
    assert set(results) <= {worker.DONE, worker.NO_WORK, worker.BUSY}
    assert AuditRecord.objects.filter(chunk=chunk).count() == 1


def test_a_planner_that_stops_half_way_resumes_without_overlap(table, make_user):
    policy = make_policy(make_user)
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=4)  # the first planner got this far and died
    first = set(Chunk.objects.filter(run=run).values_list("tenant", "key_from", "key_to"))
    # Two planners in separate processes pick up from the stored cursors at once.
    for proc in manage_at_once(*[("retention", "drain", run.run_key, "--until-idle")] * 2):
        assert proc.returncode == 0, proc.stderr
    all_chunks = list(Chunk.objects.filter(run=run).values_list("tenant", "key_from", "key_to"))
    assert first <= set(all_chunks)
    by_tenant: dict[str, list] = {}
    for tenant, lo, hi in all_chunks:
        by_tenant.setdefault(tenant, []).append((lo, hi))
    for intervals in by_tenant.values():
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:], strict=False))
    assert_converged(run)


def test_a_lost_message_is_republished_by_the_reconciler(table, make_user):
    from django_q.models import OrmQ

    from runs.engine.reconciler import reconcile
    from runs.models import Lease

    policy = make_policy(make_user)
    run, _ = trigger_run(policy, tick=NOW)
    assert OrmQ.objects.count() == 2
    OrmQ.objects.all().delete()  # the broker lost both messages
    Lease.objects.filter(run=run).update(enqueued_at=NOW - timedelta(days=1))
    report = reconcile()
    assert report["republished"] == 2
    assert OrmQ.objects.count() == 2


def one_chunk_while_the_table_is_locked(run: Run):
    """One chunk transaction while another session holds a SHARE lock on the target."""
    from runs.engine import worker

    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN SHARE MODE")
    try:
        return worker.process_one(Run.objects.get(pk=run.pk))
    finally:
        blocker.rollback()
        blocker.close()


@pytest.fixture
def guard_off(settings):
    """The lock in these tests must reach the DELETE (with the guard on, no chunk would start)."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}


def test_a_lock_timeout_is_retried_with_backoff(table, make_user, guard_off):
    from runs.engine import worker

    policy = make_policy(make_user, timeouts={"lock_ms": 200, "statement_ms": 5000})
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    outcome = one_chunk_while_the_table_is_locked(run)
    assert outcome.kind == worker.FAILED
    chunk = Chunk.objects.get(pk=outcome.chunk_id)
    assert chunk.state == Chunk.State.PENDING
    assert (chunk.attempts, chunk.last_sqlstate) == (1, "55P03")
    assert chunk.not_before > chunk.created_at
    Chunk.objects.filter(pk=chunk.pk).update(not_before=NOW - timedelta(days=1))
    drain_in_process(run)
    assert_converged(run)


def test_a_statement_timeout_splits_the_chunk(table, make_user, guard_off):

    policy = make_policy(make_user, timeouts={"lock_ms": 60000, "statement_ms": 300})
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    outcome = one_chunk_while_the_table_is_locked(run)
    parent = Chunk.objects.get(pk=outcome.chunk_id)
    assert parent.state == Chunk.State.SPLIT
    halves = Chunk.objects.filter(parent=parent).order_by("key_from")
    assert [(c.key_from, c.key_to) for c in halves] == [
        (parent.key_from, halves[0].key_to),
        (halves[0].key_to, parent.key_to),
    ]
    drain_in_process(run)
    assert_converged(run)


def test_a_missing_table_dead_letters_with_context_and_the_run_needs_attention(table, make_user):
    from runs.models import DeadLetter

    with connection.cursor() as cur:
        cur.execute("CREATE TABLE public.rr_doomed AS SELECT * FROM public.rr_events")
        cur.execute("ALTER TABLE public.rr_doomed ADD PRIMARY KEY (id)")
        cur.execute("CREATE INDEX ON public.rr_doomed (tenant_id, id)")
    policy = make_policy(make_user, slug="doomed", table="rr_doomed")
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=1000)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE public.rr_doomed")
    drain_in_process(run)
    run.refresh_from_db()
    letters = DeadLetter.objects.filter(run=run)
    assert letters.exists()
    letter = letters.first()
    assert letter.sqlstate == "42P01"
    assert letter.error_class == "permanent"
    for key in (
        "policy",
        "policy_version",
        "run",
        "tenant",
        "key_from",
        "key_to",
        "cutoff",
        "sqlstate",
        "attempts",
    ):
        assert key in letter.context
    assert run.state == Run.State.ATTENTION


def test_a_legal_hold_placed_mid_run_protects_its_rows(table, make_user):
    from retention.actions import place_hold

    policy = make_policy(make_user)
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=2)
    from runs.engine import worker

    assert worker.process_one(Run.objects.get(pk=run.pk)).kind == worker.DONE
    held_before = count("rr_events", "tenant_id = 3 AND occurred_at < %s", [run.cutoff])
    place_hold(
        policy=policy, tenant="3", actor=make_user("hilda", "compliance"), reason="litigation"
    )
    drain_in_process(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("rr_events", "tenant_id = 3 AND occurred_at < %s", [run.cutoff]) == held_before
    assert run.verification["deferred_by_holds"] > 0
    assert check_run(run, shadow=SHADOW) == []


def test_a_scheduler_down_for_three_periods_gets_one_catch_up_run(table, make_user):
    from runs.engine.reconciler import reconcile

    policy = make_policy(make_user)
    backdate_approval(policy, NOW - timedelta(days=10))
    first, _ = trigger_run(policy, tick=NOW.replace(hour=3) - timedelta(days=4))
    Run.objects.filter(pk=first.pk).update(state=Run.State.DRAINED)
    report = reconcile(now=NOW)
    assert len(report["caught_up"]) == 1
    catch_up = Run.objects.get(run_key=report["caught_up"][0])
    assert catch_up.source == "catch-up"
    assert catch_up.run_key == "events/2026-11-30T03:00"
    assert len(catch_up.skipped_ticks) == 3
    assert reconcile(now=NOW)["caught_up"] == []  # a second pass adds nothing
