"""The table-shape matrix where concurrency matters: real worker processes drain a shape
while an operator approves a new version or places a legal hold with a chunk in flight.

The chunk in flight is held on a row lock by another session; with one worker process the
table cannot change while it waits, so a copy taken then is an exact shadow of that moment.
The invariant checker then compares the end state with that copy under the rules that
apply after the decision (the new version's keep rules, the new hold)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from retention import actions as retention_actions
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import HoldScope, Shadow, check_run, take_shadow
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy
from tests.runs import shapes as S
from tests.runs.processes import (
    backends_waiting_on_delete,
    manage_in_background,
    pg_connect,
    wait_for,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

GUARD_OFF = {"RETENTION_GUARD": "0"}
TIMEOUTS = {"lock_ms": 8000, "statement_ms": 10000}  # within the task timeout; the lock goes sooner


@pytest.fixture
def shape_table(transactional_db, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    S.prepare_database()
    yield
    with connection.cursor() as cur:
        cur.execute(
            f"DROP TABLE IF EXISTS public.{S.TABLE}, public.{S.SHADOW},"
            f" public.{S.TABLE}_mid, public.{S.TABLE}_post"
        )


def build(shape: S.Shape, **spec_overrides):
    rows = S.generate_rows(shape)
    S.build_table(shape, rows)
    with connection.cursor() as cur:  # a third of the rows carry what the next version keeps
        cur.execute(f"UPDATE public.{S.TABLE} SET payload = 'v2' WHERE abs(id % 3) = 0")
        cur.execute(f"CREATE TABLE public.{S.SHADOW} AS SELECT * FROM public.{S.TABLE}")
    # per-tenant chunks: the cases follow one tenant's chunk in flight
    spec = {**S.policy_spec(shape), "timeouts": TIMEOUTS, "chunking": "tenant", **spec_overrides}
    policy = approved_policy(S.fast_user, **spec)
    return policy, spec


def drain_processes(run: Run, n: int):
    """``n`` worker processes draining the run while the test goes on."""
    return [
        manage_in_background(
            "retention", "drain", run.run_key, "--until-idle", "--budget", "60", env=GUARD_OFF
        )
        for _ in range(n)
    ]


def finish(procs) -> None:
    for proc in procs:
        done = proc.result()
        assert done.returncode == 0, done.stderr


def block_first_chunk(run: Run):
    """Plan, then lock the rows of the run's first chunk from another session."""
    planner.plan(run)
    chunk = Chunk.objects.filter(run=run).order_by("seq", "id").first()
    blocker = pg_connect(autocommit=False)
    where = "id >= %s AND id < %s" + (" AND tenant = %s" if chunk.tenant else "")
    params = [chunk.key_from, chunk.key_to] + ([chunk.tenant] if chunk.tenant else [])
    blocker.execute(f"SELECT 1 FROM public.{S.TABLE} WHERE {where} FOR UPDATE", params)
    return chunk, blocker


def advisory_waiters(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
    ).fetchone()[0]


def in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def call():
        try:
            box["result"] = fn()
        except BaseException as exc:  # reported by the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=call)
    thread.start()
    return thread, box


def test_two_worker_processes_drain_a_multi_tenant_shape(shape_table):
    shape = S.Shape("two-workers", 101, "text", rows=400, chunk_size=15, holds=())
    policy, _ = build(shape, limits={"policy_workers": 2, "tenant_workers": 1})
    hold_actor = S.fast_user("holder", "compliance")
    retention_actions.place_hold(actor=hold_actor, reason="matrix", policy=policy, tenant="Acme")
    run, _ = trigger_run(policy, tick=shape.tick)
    finish(drain_processes(run, 2))
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert AuditRecord.objects.filter(run=run).values("worker_pid").distinct().count() >= 1
    assert AuditRecord.objects.filter(run=run).exists()
    assert check_run(run, shadow=("public", S.SHADOW), holds=[HoldScope("Acme")]) == []


def test_a_version_approved_while_a_chunk_is_in_flight(shape_table):
    shape = S.Shape("approval-in-flight", 102, "integer", rows=300, chunk_size=20)
    policy, spec = build(shape, limits={"policy_workers": 1, "tenant_workers": 1})
    run, _ = trigger_run(policy, tick=shape.tick)
    chunk, blocker = block_first_chunk(run)
    observer = pg_connect()
    v2 = {**spec, "keep": [*spec["keep"], {"column": "payload", "op": "=", "value": "v2"}]}
    procs = drain_processes(run, 1)
    try:
        wait_for(lambda: backends_waiting_on_delete(observer, S.TABLE), what="the DELETE")
        # one worker, stuck on the lock: nothing can change the table until it is released
        mid = take_shadow("public", S.TABLE, f"{S.TABLE}_mid")
        thread, box = in_thread(lambda: approved_policy(S.fast_user, **v2))
        wait_for(
            lambda: not thread.is_alive() or advisory_waiters(observer),
            what="the approval to commit or to wait",
        )
        post = None
        if not thread.is_alive():  # approved while the chunk still waits: nothing moved yet
            post = take_shadow("public", S.TABLE, f"{S.TABLE}_post")
        blocker.rollback()
        thread.join(timeout=60)
        assert "error" not in box, box.get("error")
        if post is None:  # the approval waited for the chunk; the chunk committed first
            post = take_shadow("public", S.TABLE, f"{S.TABLE}_post")
        finish(procs)
    finally:
        blocker.close()
        observer.close()
    run.refresh_from_db()
    assert run.state != Run.State.ACTIVE
    # the first run deleted only inside its own version's scope, and audited all of it
    assert check_run(run, shadow=mid, expect_drained=False, holds=[]) == []
    # after the approval committed, nothing outside the new version's scope went
    later, _ = trigger_run(policy, tick=shape.tick + timedelta(days=1))
    worker.drain(later.pk, budget_s=60)
    later.refresh_from_db()
    assert later.state == Run.State.DRAINED, later.state_reason
    assert later.policy_version.number == 2
    assert check_run(later, shadow=post) == []
    assert AuditRecord.objects.filter(chain_seq__gt=mid.after_seq).exists()


def test_a_hold_placed_while_a_chunk_is_in_flight(shape_table):
    shape = S.Shape("hold-in-flight", 103, "integer", rows=300, chunk_size=20)
    policy, _ = build(shape, limits={"policy_workers": 1, "tenant_workers": 1})
    run, _ = trigger_run(policy, tick=shape.tick)
    chunk, blocker = block_first_chunk(run)
    observer = pg_connect()
    actor = S.fast_user("holder", "compliance")
    procs = drain_processes(run, 1)
    try:
        wait_for(lambda: backends_waiting_on_delete(observer, S.TABLE), what="the DELETE")
        mid = take_shadow("public", S.TABLE, f"{S.TABLE}_mid")
        thread, box = in_thread(
            lambda: retention_actions.place_hold(
                actor=actor, reason="case 11", policy=policy, tenant=chunk.tenant
            )
        )
        wait_for(
            lambda: not thread.is_alive() or advisory_waiters(observer),
            what="the hold to commit or to wait",
        )
        # the hold fence: the hold waits for the chunk already past it
        waited = thread.is_alive()
        blocker.rollback()
        thread.join(timeout=60)
        assert "error" not in box, box.get("error")
        finish(procs)
    finally:
        blocker.close()
        observer.close()
    assert waited, "the hold committed while a chunk of its tenant was in flight"
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    # The chunk in flight committed before the hold; every other row of the tenant is held.
    tenant = chunk.tenant
    held = [HoldScope(tenant, None, chunk.key_from), HoldScope(tenant, chunk.key_to, None)]
    assert check_run(run, shadow=mid, holds=held) == []
    assert check_run(run, shadow=Shadow("public", S.SHADOW), expect_drained=False, holds=[]) == []
    after_hold = AuditRecord.objects.filter(run=run, tenant=tenant).exclude(chunk_id=chunk.pk)
    assert AuditRecord.objects.filter(chunk_id=chunk.pk, rows_deleted__gt=0).exists()
    assert sum(after_hold.values_list("rows_deleted", flat=True)) == 0
