"""A chunk that runs longer than django-q2's task timeout is killed with its task (a
``TimeoutException``, which no ``except Exception`` sees) and records nothing in its own
transaction. The claim recorded before that transaction makes the kill count as an attempt,
so the chunk is split (or dead-lettered), never retried at the same size for ever."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine.reconciler import reconcile
from runs.evidence.invariants import check_run
from runs.models import Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import kill_group, pg_connect, spawn, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# A task timeout far below what the policy's timeouts let a chunk wait for a lock.
CLUSTER_ENV = {
    "Q_CLUSTER_NAME": "cleanup",
    "RETENTION_Q_TIMEOUT": "4",
    "RETENTION_Q_RETRY": "6",
    "RETENTION_LEASE_BUDGET_S": "2",
    "RETENTION_GUARD": "0",
}
IN_CHUNK = "id >= %s AND id < %s AND tenant_id::text = %s"


@pytest.fixture
def table(transactional_db, settings):
    settings.RETENTION = {**settings.RETENTION, "LEASE_STALE_S": 5}  # for reconcile() below
    create_events(3000)
    yield "rr_events"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_a_chunk_killed_by_the_task_timeout_counts_as_an_attempt_and_is_split(table, make_user):
    from runs.engine import planner

    policy = approved_policy(
        make_user,
        **events_spec(
            timeouts={"lock_ms": 8000, "statement_ms": 10000}, limits={"policy_workers": 1}
        ),
    )
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=4)
    stuck = Chunk.objects.filter(run=run).order_by("seq", "id").first()
    blocker = pg_connect(autocommit=False)  # its rows stay locked longer than the task may run
    blocker.execute(
        f"SELECT 1 FROM public.rr_events WHERE {IN_CHUNK} FOR UPDATE",
        [stuck.key_from, stuck.key_to, stuck.tenant],
    )
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:

        def decided():
            reconcile()  # re-publishes the lease the timeout killed
            stuck.refresh_from_db()
            return stuck.state != Chunk.State.PENDING

        wait_for(decided, timeout=120, interval=1, what="the killed chunk to be split")
        assert stuck.state in (Chunk.State.SPLIT, Chunk.State.DEAD)
        assert stuck.attempts >= 1
        assert "killed" in stuck.last_error
        blocker.rollback()

        def finished():
            reconcile()
            return Run.objects.get(pk=run.pk).state == Run.State.DRAINED

        wait_for(finished, timeout=180, interval=1, what="the run to drain")
    finally:
        blocker.close()
        kill_group(cluster, signal.SIGTERM)
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []
