"""The guard's samples are taken beside the chunks, not between them. A worker's own admission
samples before its next chunk opens, when none of its chunks is in flight: with one chunk
transaction at a time (the controller's floor) the probe would never meet one, and the
controller would judge a foreground that the chunks slow as idle. A thread of each draining
process samples on its own clock instead (``guard.sample_beside``). Real worker processes on
real PostgreSQL; asserted on the recorded samples."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.db.models import Max, Min

from runs.actions import trigger_run
from runs.models import AuditRecord, GuardSample, Run
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events, worker_env

TABLE = "public.rr_events"


def drain_env(*, thread: bool, sample_ms: int = 50) -> dict:
    return {
        **os.environ,
        **worker_env(),
        "RETENTION_GUARD_SAMPLE_MS": str(sample_ms),
        "RETENTION_GUARD_PROBE_MS": "20",
        "RETENTION_GUARD_SAMPLER_THREAD": "1" if thread else "0",
        # the controller on (it asks for the probes between samples) with nothing to move:
        # its floor is the policy's own settings, so chunks run back to back throughout
        "RETENTION_GUARD_DUTY_FLOOR_PCT": "50",
        "RETENTION_GUARD_CHUNK_MS_FLOOR": "100000",
        # its steps every half second: a wait of a period at its floor is half a second
        "RETENTION_GUARD_CONTROL_PERIOD_MS": "500",
    }


DRAIN = [sys.executable, "manage.py", "retention", "drain"]


def drain(run_key: str, *, thread: bool, sample_ms: int = 50) -> subprocess.CompletedProcess:
    """A worker process draining the run until it is idle (forked from the test process's
    zygote: tests/zygote.py)."""
    env = drain_env(thread=thread, sample_ms=sample_ms)
    return zygote.run([*DRAIN, run_key, "--until-idle"], cwd=ROOT, env=env, timeout=300)


def slow_deletes() -> None:
    with connection.cursor() as cur:
        # every deleted row takes a millisecond: a chunk of 40 rows is 40 ms in flight
        cur.execute(
            "CREATE FUNCTION public.rr_slow_delete() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.001); RETURN OLD; END $$"
        )
        cur.execute(
            "CREATE TRIGGER rr_slow BEFORE DELETE ON public.rr_events"
            " FOR EACH ROW EXECUTE FUNCTION public.rr_slow_delete()"
        )


def slow_policy(make_user, *, workers: int):
    """Key chunks of 40 rows (40 ms each over ``slow_deletes``), ``workers`` at once."""
    return approved_policy(
        make_user,
        **events_spec(
            keep=[],
            chunking="key",
            chunk_size=40,
            limits={"policy_workers": workers, "tenant_workers": workers},
            guard={"probe_p95_ms": 5000.0, "lock_waits": 1000},
        ),
    )


def drop_events() -> None:
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
        cur.execute("DROP FUNCTION IF EXISTS public.rr_slow_delete()")


@pytest.mark.parametrize("thread", [True, False], ids=["sampler-thread", "admissions-only"])
def test_with_one_chunk_at_a_time_the_samples_meet_chunks_in_flight(
    transactional_db, make_user, thread
):
    create_events(3000)
    slow_deletes()
    policy = slow_policy(make_user, workers=1)
    run, _ = trigger_run(policy, tick=NOW)
    try:
        done = drain(run.run_key, thread=thread)
        assert done.returncode == 0, done.stdout + done.stderr
        run.refresh_from_db()
        assert run.state == Run.State.DRAINED, done.stdout + done.stderr
        chunks = list(
            AuditRecord.objects.filter(run_id=run.pk).values_list("started_at", "committed_at")
        )
        assert len(chunks) >= 20
        taken = [
            s.taken_at
            for s in GuardSample.objects.all()
            if s.tables.get(TABLE, {}).get("probe_ms") is not None
        ]
        # samples taken while a chunk transaction of the run was open
        met = sum(1 for t in taken if any(a <= t <= b for a, b in chunks))
        if thread:
            # the chunks fill most of the drain's time: so do the samples that meet them
            assert len(taken) >= 10 and met >= 3, (met, len(taken))
            # and between its samples the thread probes: [ms, epoch] readings
            between = [
                r
                for s in GuardSample.objects.all()
                for r in s.tables.get(TABLE, {}).get("probes", [])
            ]
            # (how many depends on how often a busy machine lets the thread run: some, at least)
            assert len(between) >= 3, (len(between), len(taken))
            assert all(ms > 0 for ms, _ in between)
        else:
            # every sample is the admission's, before the worker's next chunk opens
            assert len(taken) >= 10 and met == 0, (met, len(taken))
    finally:
        drop_events()


def test_with_two_workers_the_samples_are_the_threads_and_keep_its_probes(
    transactional_db, make_user
):
    """Two worker processes drain one run; the sampler thread of one of them takes the
    samples, with the probes it took between them. An admission samples only when the
    thread's sample is two intervals old: before, the other worker's admission took the
    sample as soon as one interval had passed — most of them — and the probes the thread took
    meanwhile never reached the controller (eight readings in a three-second run)."""
    create_events(6000)  # six seconds of chunks: both workers are up well before the end
    slow_deletes()
    policy = slow_policy(make_user, workers=2)
    run, _ = trigger_run(policy, tick=NOW)
    interval_ms = 200
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            workers = [
                pool.submit(drain, run.run_key, thread=True, sample_ms=interval_ms)
                for _ in range(2)
            ]
            done = [w.result() for w in workers]
        assert [d.returncode for d in done] == [0, 0], [d.stdout + d.stderr for d in done]
        run.refresh_from_db()
        assert run.state == Run.State.DRAINED, done[0].stdout + done[0].stderr
        pids = set(AuditRecord.objects.filter(run_id=run.pk).values_list("worker_pid", flat=True))
        assert len(pids) == 2  # both drained
        first, last = (
            AuditRecord.objects.filter(run_id=run.pk)
            .aggregate(first=Min("started_at"), last=Max("committed_at"))
            .values()
        )
        during = list(
            GuardSample.objects.filter(taken_at__gt=first, taken_at__lte=last).order_by("taken_at")
        )
        # who took each sample, and how long after the one before (the message of a failure)
        seen = [
            f"{s.values.get('taken_by')} +{(s.taken_at - b.taken_at).total_seconds() * 1000:.0f} ms"
            for b, s in zip([during[0], *during], during, strict=False)
        ]
        assert len(during) >= 5, seen
        by = Counter(s.values.get("taken_by") for s in during)
        assert set(by) <= {"sampler", "admission", "lease"}, seen
        # an admission took one only where the thread's was two intervals old
        for before, s in zip(during, during[1:], strict=False):
            if s.values["taken_by"] == "admission":
                gap_ms = (s.taken_at - before.taken_at).total_seconds() * 1000
                assert gap_ms >= 2 * interval_ms, seen
        assert by["sampler"] > len(during) / 2, seen
        # and the thread's samples carry its probes between them
        between = [r for s in during for r in s.tables.get(TABLE, {}).get("probes", [])]
        assert len(between) >= by["sampler"], (len(between), by)
    finally:
        drop_events()
