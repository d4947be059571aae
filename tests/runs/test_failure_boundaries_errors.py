"""Failure boundaries of the design that are errors, with real processes (the others are in
test_failure_boundaries.py beside it): a connection reset in the middle of a chunk (transient)
and a foreign key that restricts the DELETE (permanent, dead letter, replay after the cause is
removed)."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import planner
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, DeadLetter, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count, create_events, manage, pin_one_eligible_row
from tests.runs.processes import kill_group, pg_connect, spawn, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SHADOW = ("public", "rr_events_shadow")
IN_CHUNK = "id >= %s AND id < %s AND tenant_id::text = %s"


@pytest.fixture
def policy(transactional_db, make_user):
    create_events(3000)
    yield approved_policy(
        make_user, slug="events", table="public.rr_events", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=200, keep=[{"column": "status", "op": "=", "value": "disputed"}],
        timeouts={"lock_ms": 8000, "statement_ms": 10000},
        limits={"policy_workers": 2, "tenant_workers": 1},
        chunking="tenant",  # these tests follow one tenant's chunk
    )  # fmt: skip
    with connection.cursor() as cur:
        cur.execute(
            "DROP TABLE IF EXISTS public.rr_child, public.rr_events, public.rr_events_shadow"
        )


def test_a_connection_reset_mid_chunk_rolls_back_and_the_chunk_is_retried(policy):
    run, _ = trigger_run(policy, tick=NOW)
    before = count("rr_events")
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN SHARE MODE")  # the DELETE must wait
    worker = spawn("retention", "drain", run.run_key, "--until-idle", env={"RETENTION_GUARD": "0"})
    observer = pg_connect()
    try:
        pid = wait_for(
            lambda: (
                observer.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND application_name LIKE 'retention:%%' AND query ILIKE 'DELETE FROM%%rr_events%%'"
                ).fetchone()
                or [None]
            )[0],
            what="a DELETE waiting on the lock",
        )
        assert observer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        assert count("rr_events") == before
        assert not AuditRecord.objects.exists()
    finally:
        blocker.rollback()
        blocker.close()
        observer.close()
    try:
        _, err = worker.communicate(timeout=300)  # the worker reconnects and carries on
    except Exception:
        kill_group(worker, signal.SIGKILL)
        raise
    assert worker.returncode == 0, err
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert AuditRecord.objects.filter(run=run).count() == done
    assert check_run(run, shadow=SHADOW) == []


def test_a_foreign_key_that_restricts_the_delete_is_bisected_to_its_row_and_a_replay_finishes(
    policy, make_user, act_as
):
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=1000)
    chunk = Chunk.objects.filter(run=run).order_by("seq", "id").first()
    pinned = count("rr_events", IN_CHUNK, [chunk.key_from, chunk.key_to, chunk.tenant])
    pin_one_eligible_row(chunk, run.cutoff)  # a child row pins one eligible row of the chunk
    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "60", timeout=300
    )
    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state_reason
    letter = DeadLetter.objects.get(run=run)
    # ON DELETE RESTRICT raises restrict_violation (23001) on PostgreSQL 18 and
    # foreign_key_violation (23503) on 15; both are permanent
    # the chunk was bisected down to the pinned row: only that one-key chunk is dead-lettered
    leaf = letter.chunk
    assert letter.error_class == "permanent"
    assert leaf.key_to - leaf.key_from == 1 and chunk.key_from <= leaf.key_from < chunk.key_to
    assert letter.sqlstate in {"23001", "23503"}
    assert {"table", "tenant", "key_from", "key_to", "cutoff", "run"} <= set(letter.context)
    eligible_in_chunk = IN_CHUNK + " AND occurred_at < %s AND status <> 'disputed'"
    args = [chunk.key_from, chunk.key_to, chunk.tenant, run.cutoff]
    assert count("rr_events", eligible_in_chunk, args) == 1  # everything else was deleted
    assert pinned > 1
    assert not AuditRecord.objects.filter(chunk=leaf).exists()
    assert check_run(run, shadow=SHADOW, expect_drained=False) == []

    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.rr_child")  # on-call removes the cause
    act_as(make_user("olga", "oncall"))
    replay = manage("retention", "replay", str(letter.pk), "--reason", "child row removed")
    assert replay.returncode == 0, replay.stderr
    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "60", timeout=300
    )
    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert AuditRecord.objects.filter(chunk=leaf).count() == 1
    assert check_run(run, shadow=SHADOW) == []
