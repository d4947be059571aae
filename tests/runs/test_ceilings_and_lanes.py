"""Ceilings hold across separate qcluster processes (standing in for hosts), quiet tenants are
not starved by a busy one, and a saturated cleanup lane leaves the deadline lane on time."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection
from django.utils import timezone

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import kill_group, spawn, task_outcomes, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

CLUSTER_ENV = {
    "Q_CLUSTER_NAME": "cleanup",
    "CLEANUP_WORKERS": "2",
    "RETENTION_GLOBAL_CEILING": "3",
    "RETENTION_Q_TIMEOUT": "10",
    "RETENTION_Q_RETRY": "12",
    "RETENTION_LEASE_BUDGET_S": "3",
    "RETENTION_GUARD": "0",
}


@pytest.fixture
def busy_table(transactional_db):
    create_events(24000, tenants=8)  # tenant 1 holds 40% of the rows
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def max_overlap(intervals: list[tuple]) -> int:
    events = sorted(
        [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1])
    )
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def test_ceilings_hold_across_two_clusters_and_quiet_tenants_are_not_starved(busy_table, make_user):
    # paced (600 rows/s a worker): the drain outlasts a lease budget however fast chunks are,
    # so the second cluster gets leases even when the first took every lease at the start
    policy = approved_policy(
        make_user,
        **events_spec(
            keep=[], chunk_size=60, pace_rows_per_s=2400,
            limits={"policy_workers": 4, "tenant_workers": 1},
        ),
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    clusters = [spawn("qcluster", env=CLUSTER_ENV) for _ in range(2)]
    try:
        wait_for(
            lambda: Run.objects.get(pk=run.pk).state == Run.State.DRAINED,
            timeout=240,
            interval=0.5,
            what="drained",
        )
    finally:
        for cluster in clusters:
            kill_group(cluster, signal.SIGTERM)
    records = list(
        AuditRecord.objects.filter(run=run).values_list(
            "tenant", "started_at", "committed_at", "worker_pid"
        )
    )
    assert len({pid for *_, pid in records}) >= 2, "both clusters should have worked"
    by_tenant: dict[str, list] = {}
    for tenant, start, end, _ in records:
        by_tenant.setdefault(tenant, []).append((start, end))
    for tenant, intervals in by_tenant.items():
        assert max_overlap(intervals) <= 1, f"tenant {tenant} exceeded its ceiling"
    assert max_overlap([(s, e) for _, s, e, _ in records]) <= 3  # the global ceiling
    # Fair order: tenant 1 (40% of the rows) is held to one chunk at a time while the seven
    # quiet tenants share the other slots, so each quiet tenant starts within tenant 1's first
    # third (a window planned a few chunks at a time, taken by two clusters that a busy machine
    # may wake late) and is finished before tenant 1 is (a planner that queued tenant 1's chunks
    # first would leave the other slots idle and fail both).
    busy = sorted((start, end) for start, end in by_tenant["1"])
    first_third = busy[len(busy) // 3][0]
    for tenant, intervals in by_tenant.items():
        if tenant != "1":
            assert min(start for start, _ in intervals) <= first_third, (
                f"tenant {tenant} started behind tenant 1"
            )
            assert max(end for _, end in intervals) <= busy[-1][1], (
                f"tenant {tenant} waited behind tenant 1"
            )
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


DEADLINE_JOBS: list[str] = []


def lateness_of_deadline_jobs(count: int) -> list[float]:
    """Enqueue ``count`` deadline-lane jobs, 0.3 s apart, and return how late each started."""
    from django_q.tasks import async_task

    ids = []
    for _ in range(count):
        ids.append(
            async_task(
                "demo.tasks.send_due_reminders", due=timezone.now().isoformat(), cluster="deadline"
            )
        )
        time.sleep(0.3)
    wait_for(lambda: len(task_outcomes(ids, "deadline")) == count, timeout=60, what="deadline jobs")
    DEADLINE_JOBS.extend(ids)
    return sorted(task.result["lateness_s"] for task in task_outcomes(ids, "deadline").values())


def test_a_saturated_cleanup_lane_leaves_the_deadline_lane_its_capacity(busy_table, make_user):
    from django_q.models import OrmQ

    deadline = spawn("qcluster", env={"Q_CLUSTER_NAME": "deadline", "DEADLINE_WORKERS": "1"})
    cleanup = None
    try:
        idle = lateness_of_deadline_jobs(6)
        policy = approved_policy(
            make_user,
            **events_spec(
                keep=[],
                chunk_size=30,
                limits={"policy_workers": 8, "tenant_workers": 2},
                pace_rows_per_s=2000,
            ),
        )
        trigger_run(policy, tick=NOW)
        cleanup = spawn("qcluster", env={**CLUSTER_ENV, "CLEANUP_WORKERS": "1"})
        wait_for(lambda: AuditRecord.objects.exists(), timeout=60, what="cleanup to start")
        waiting = OrmQ.objects.filter(key="cleanup").count()
        busy = lateness_of_deadline_jobs(6)
        still_waiting = OrmQ.objects.filter(key="cleanup").count()
    finally:
        kill_group(deadline, signal.SIGTERM)
        if cleanup is not None:
            kill_group(cleanup, signal.SIGTERM)
    assert waiting >= 4 and still_waiting >= 4, (
        "the cleanup lane should have had a backlog of leases"
    )
    # Every deadline job ran on the deadline cluster while cleanup leases still queued: the
    # saturated lane never took the other's capacity (how late each was is bench material).
    assert len(idle) == len(busy) == 6
    ran = task_outcomes(DEADLINE_JOBS[-12:], "deadline").values()
    assert len(ran) == 12 and {task.cluster for task in ran} == {"deadline"}
    assert all(task.success and task.func == "demo.tasks.send_due_reminders" for task in ran)
