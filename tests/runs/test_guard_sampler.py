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

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.models import AuditRecord, GuardSample, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events, worker_env

TABLE = "public.rr_events"


def drain(run_key: str, *, thread: bool, log) -> int:
    env = {
        **os.environ,
        **worker_env(),
        "RETENTION_GUARD_SAMPLE_MS": "50",
        "RETENTION_GUARD_PROBE_MS": "20",
        "RETENTION_GUARD_SAMPLER_THREAD": "1" if thread else "0",
        # the controller on (it asks for the probes between samples) with nothing to move:
        # its floor is the policy's own settings, so chunks run back to back throughout
        "RETENTION_GUARD_DUTY_FLOOR_PCT": "50",
        "RETENTION_GUARD_CHUNK_MS_FLOOR": "100000",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "retention", "drain", run_key, "--until-idle"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        timeout=300,
    ).returncode


@pytest.mark.parametrize("thread", [True, False], ids=["sampler-thread", "admissions-only"])
def test_with_one_chunk_at_a_time_the_samples_meet_chunks_in_flight(
    transactional_db, make_user, tmp_path, thread
):
    create_events(3000)
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
    policy = approved_policy(
        make_user,
        **events_spec(
            keep=[],
            chunking="key",
            chunk_size=40,
            limits={"policy_workers": 1, "tenant_workers": 1},
            guard={"probe_p95_ms": 5000.0, "lock_waits": 1000},
        ),
    )
    run, _ = trigger_run(policy, tick=NOW)
    try:
        with open(tmp_path / "worker.log", "w") as log:
            assert drain(run.run_key, thread=thread, log=log) == 0
        run.refresh_from_db()
        assert run.state == Run.State.DRAINED, (tmp_path / "worker.log").read_text()
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
            assert len(between) >= len(taken), (len(between), len(taken))
            assert all(ms > 0 for ms, _ in between)
        else:
            # every sample is the admission's, before the worker's next chunk opens
            assert len(taken) >= 10 and met == 0, (met, len(taken))
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
            cur.execute("DROP FUNCTION IF EXISTS public.rr_slow_delete()")
