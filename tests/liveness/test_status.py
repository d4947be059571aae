"""A run that is not progressing always says why; "progressing" means recent progress."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.actions import trigger_run
from runs.engine import planner
from runs.models import Chunk, Lease, Run
from runs.status import run_status
from tests.runs.conftest import NOW


@pytest.fixture
def idle_run(events_policy):
    """Started 40 s ago, chunks planned, nothing committed."""
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=40))
    run.refresh_from_db()
    return run


def test_a_throttle_whose_back_off_ended_is_still_the_reason(idle_run):
    chunk = Chunk.objects.filter(run=idle_run).first()
    Chunk.objects.filter(pk=chunk.pk).update(
        not_before=timezone.now() - timedelta(seconds=3),  # the guard's back-off just ended
        throttle_reason="lock held on public.rr_events: ShareLock by pid 4242; 5 session(s) waiting",
    )
    status = run_status(idle_run)
    assert status["health"] == "throttled"
    assert "ShareLock by pid 4242" in status["waiting_reason"]


def test_a_chunk_that_could_not_get_its_lock_says_so(idle_run):
    chunk = Chunk.objects.filter(run=idle_run).first()
    Chunk.objects.filter(pk=chunk.pk).update(
        attempts=1, last_error="canceling statement due to lock timeout", not_before=timezone.now()
    )
    status = run_status(idle_run)
    assert status["health"] == "waiting"
    assert status["waiting_reason"].startswith("blocked on a lock")


def test_no_worker_alive_or_no_chunk_admitted_is_named(idle_run):
    Lease.objects.filter(run=idle_run).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    status = run_status(idle_run)
    assert status["health"] == "stuck"
    assert status["waiting_reason"].startswith("no worker alive")
    Lease.objects.filter(run=idle_run).update(heartbeat_at=timezone.now())
    status = run_status(idle_run)
    assert status["health"] == "waiting"
    assert "admitted no chunk" in status["waiting_reason"]
    assert status["health"] != "progressing"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_drain_with_two_workers_runs_two_processes(make_user):
    from runs.evidence.invariants import check_run
    from runs.models import AuditRecord
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import create_events, manage

    create_events(12000)
    # paced (750 rows/s a worker): the drain outlasts the second process's start-up however
    # fast chunks are, so both processes drain
    policy = approved_policy(make_user, **events_spec(chunk_size=40, pace_rows_per_s=1500))
    run, _ = trigger_run(policy, tick=NOW)
    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--workers", "2", "--budget", "30",
        env={"RETENTION_GUARD": "0"}, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    pids = set(AuditRecord.objects.filter(run=run).values_list("worker_pid", flat=True))
    assert len(pids) == 2, pids
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []
