"""The engine under a real django-q2 cleanup cluster: delivery, redelivery after a crash,
and a graceful stop."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import finished_tasks, kill_group, spawn, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CLUSTER_ENV = {
    "Q_CLUSTER_NAME": "cleanup",
    "RETENTION_LEASE_STALE_S": "8",
    "RETENTION_Q_TIMEOUT": "10",
    "RETENTION_Q_RETRY": "12",
    "RETENTION_LEASE_BUDGET_S": "3",
}


@pytest.fixture(autouse=True)
def broker_is_reachable(settings):
    """With RETENTION_BROKER=redis these tests need Redis; without it they say so and skip,
    unless RETENTION_REQUIRE_REDIS=1 (CI), where a missing Redis is a failure."""
    if settings.RETENTION["BROKER"] != "redis":
        return
    import os

    import redis

    try:
        redis.from_url(settings.Q_CLUSTER["redis"]).ping()
    except redis.RedisError as exc:
        if os.environ.get("RETENTION_REQUIRE_REDIS") == "1":
            pytest.fail(f"Redis is required here but not reachable: {exc}")
        pytest.skip(f"Redis not reachable ({exc}); the Redis-broker delivery tests did not run")
    # Redis outlives the test database: messages an earlier test left (a killed cluster's, a
    # stopped lease's next generation) would name runs that no longer exist.
    from django_q.brokers import get_broker

    for name in ("cleanup", "deadline", settings.Q_CLUSTER["name"]):
        get_broker(list_key=name).purge_queue()


@pytest.fixture
def run(transactional_db, make_user):
    create_events(12000)
    policy = approved_policy(make_user, **events_spec(chunk_size=60))
    run, _ = trigger_run(policy, tick=NOW)
    yield run
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def state_of(run: Run) -> str:
    return Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()


def test_a_cleanup_cluster_drains_a_run_from_its_leases(run):
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: state_of(run) == Run.State.DRAINED,
            timeout=120,
            interval=0.5,
            what="the run to drain",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


def test_a_cluster_killed_after_commit_is_redelivered_without_a_second_audit_row(run):
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: AuditRecord.objects.filter(run=run).count() >= 3,
            timeout=60,
            interval=0.05,
            what="commits",
        )
    finally:
        kill_group(cluster, signal.SIGKILL)  # committed chunks, unacknowledged messages
    assert state_of(run) == Run.State.ACTIVE
    survivor = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: state_of(run) == Run.State.DRAINED,
            timeout=150,
            interval=0.5,
            what="redelivery to drain",
        )
    finally:
        kill_group(survivor, signal.SIGTERM)
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert AuditRecord.objects.filter(run=run).count() == done
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


def test_sigterm_lets_in_flight_chunks_finish_and_leaves_nothing_half_done(run):
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    wait_for(
        lambda: AuditRecord.objects.filter(run=run).count() >= 2,
        timeout=60,
        interval=0.05,
        what="commits",
    )
    cluster.send_signal(signal.SIGTERM)  # the main PID only, as a supervisor should
    cluster.wait(timeout=60)
    assert cluster.returncode is not None
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert AuditRecord.objects.filter(run=run).count() == done
    assert check_run(run, shadow=("public", "rr_events_shadow"), expect_drained=False) == []
    # and the run goes on when a cluster comes back
    again = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: state_of(run) == Run.State.DRAINED,
            timeout=150,
            interval=0.5,
            what="the run to finish",
        )
    finally:
        kill_group(again, signal.SIGTERM)


def test_sigterm_ends_each_lease_at_its_next_chunk_boundary_and_requeues_it(
    transactional_db, make_user, settings
):
    """One worker, three slots: one lease drains (paced, with a long budget), two wait in the
    worker's in-memory queue. After SIGTERM at most the chunk in flight commits, no waiting
    lease starts a chunk, and every slot's next generation is back in the queue."""
    from django.utils import timezone
    from django_q.models import OrmQ

    from runs.models import Lease

    create_events(12000)
    policy = approved_policy(
        make_user,
        **events_spec(chunk_size=60, pace_rows_per_s=300, limits={"policy_workers": 3}),
    )
    run, _ = trigger_run(policy, tick=NOW)
    env = dict(
        CLUSTER_ENV,
        CLEANUP_WORKERS="1",
        RETENTION_LEASE_BUDGET_S="40",
        RETENTION_Q_TIMEOUT="50",
        RETENTION_Q_RETRY="60",
    )
    cluster = spawn("qcluster", env=env)
    try:
        wait_for(
            lambda: AuditRecord.objects.filter(run=run).count() >= 3,
            timeout=60,
            interval=0.05,
            what="commits",
        )
        stop_requested = timezone.now()
        cluster.send_signal(signal.SIGTERM)  # the main PID only, as a supervisor should
        cluster.wait(timeout=120)
    finally:
        kill_group(cluster, signal.SIGKILL)
    after_stop = AuditRecord.objects.filter(run=run, started_at__gt=stop_requested).count()
    assert after_stop <= 1, f"{after_stop} chunks started after SIGTERM"
    results = [
        t.result
        for t in finished_tasks("cleanup")
        if t.func == "runs.tasks.drain_lease" and t.success and t.args[0] == run.pk
    ]
    assert results and all(r["stopped"] == "worker stopping" for r in results), results
    # every slot published its next generation (the first came with the trigger)
    current = {(run.pk, lease.slot, lease.generation) for lease in Lease.objects.filter(run=run)}
    assert len(current) == 3 and all(generation >= 2 for _, _, generation in current)
    if settings.RETENTION["BROKER"] == "orm":  # and its message waits in the queue
        queued = {
            tuple(q.task["args"])
            for q in OrmQ.objects.all()
            if q.func() == "runs.tasks.drain_lease"
        }
        assert current <= queued
    assert state_of(run) == Run.State.ACTIVE
    assert check_run(run, shadow=("public", "rr_events_shadow"), expect_drained=False) == []
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
