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
def test_drain_with_two_workers_runs_both_in_one_process(make_user):
    from runs.evidence.invariants import check_run
    from runs.models import AuditRecord
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import create_events, manage

    create_events(12000)
    # paced (750 rows/s a worker), so both workers drain
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
    assert len(pids) == 1, pids  # one process start-up
    workers = [line for line in result.stdout.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2 and not any(" 0 chunk(s)" in line for line in workers), workers
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


# -- the guard's silent stall: no admitted chunk for longer than the guard window -----------

CALM = {"lock_waits": 0, "replication_lag_s": 0.0, "connections_free": 100, "wal_mb_per_s": 0.0}


def _later(monkeypatch, seconds: float) -> None:
    """Look at the run ``seconds`` from now (nothing else happens meanwhile)."""
    from django.utils import timezone as django_timezone

    real = django_timezone.now
    at = real() + timedelta(seconds=seconds)
    monkeypatch.setattr(django_timezone, "now", lambda: at)


def _page(run, make_user) -> str:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(make_user("vic-stall", "viewer"))
    return client.get(reverse("runs:detail", args=[run.pk])).content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_run_the_guard_stopped_after_a_commit_does_not_say_progressing(
    make_user, settings, monkeypatch
):
    """Chunks committed, then the guard refused every chunk: once the guard window has passed
    without an admitted chunk, the run says throttled and why (before: "progressing" for a
    whole lease budget after the last commit)."""
    from io import StringIO

    from django.core.management import call_command

    from runs.engine import worker
    from runs.models import GuardSample
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import create_events

    create_events(3000)
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    policy = approved_policy(make_user, **events_spec(guard={"lock_waits": 10}))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    settings.RETENTION = {**settings.RETENTION, "GUARD": True}
    GuardSample.objects.create(values={**CALM, "lock_waits": 14}, tables={})
    stats = worker.drain(run.pk, budget_s=10, until_idle=True)
    assert stats["throttled"] >= 1, stats
    window = settings.RETENTION["GUARD_DUTY_WINDOW_S"]
    _later(monkeypatch, window + 2)
    status = run_status(Run.objects.get(pk=run.pk))
    assert status["health"] == "throttled", status
    assert "lock waits 14 > 10" in status["waiting_reason"]
    out = StringIO()
    call_command("retention", "status", run.run_key, stdout=out)
    assert "lock waits 14 > 10" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_partitions_the_guard_holds_back_says_why(make_user, settings, monkeypatch):
    """The guard holds the partition step back, so no chunk is even planned: the run names the
    guard's reason — in retention status and on the run page — instead of "concurrency
    ceilings full or an operator decision in progress"."""
    from io import StringIO

    from django.core.management import call_command
    from django.db import connection

    from runs.engine import worker
    from runs.models import GuardSample
    from tests.factories import approved_policy
    from tests.runs.test_partitions import MONTHS, create_partitioned, parts_spec

    settings.RETENTION = {**settings.RETENTION, "GUARD": True}
    create_partitioned()
    try:
        policy = approved_policy(make_user, **parts_spec(keep=[], guard={"lock_waits": 10}))
        run, _ = trigger_run(policy, tick=NOW)
        GuardSample.objects.create(values={**CALM, "lock_waits": 14}, tables={})
        stats = worker.drain(run.pk, budget_s=10, until_idle=True)
        assert stats["stopped"].startswith("idle: partitions postponed"), stats
        Lease.objects.filter(run=run).update(heartbeat_at=timezone.now())
        _later(monkeypatch, settings.RETENTION["GUARD_DUTY_WINDOW_S"] + 2)
        run = Run.objects.get(pk=run.pk)
        status = run_status(run)
        assert status["health"] == "throttled", status
        assert "lock waits 14 > 10" in status["waiting_reason"], status
        out = StringIO()
        call_command("retention", "status", run.run_key, stdout=out)
        assert "lock waits 14 > 10" in out.getvalue()
        assert "lock waits 14 &gt; 10" in _page(run, make_user)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
            for month in MONTHS:
                cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")
