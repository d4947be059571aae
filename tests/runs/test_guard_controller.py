"""The guard's latency controller with a real worker process on a real table: a foreground
load that inflates the probe far over its idle value makes it lower the chunk transactions at
once, the chunk target duration and the duty cycle; when the load stops it raises them again.
Asserted on the controller's recorded steps, never on timings."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import guard
from runs.models import GuardControl, GuardControlStep, Run
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events, worker_env
from tests.runs.processes import pg_connect, wait_for

MARGIN_MS = 40
WORKER_ENV = {
    "RETENTION_GUARD_SAMPLE_MS": "200",
    "RETENTION_GUARD_CONTROL_PERIOD_MS": "500",
    # tens of milliseconds of jitter on a busy machine are not the load under test (the
    # test's lock load holds each read 100 ms)
    "RETENTION_GUARD_PROBE_MARGIN_MS": str(MARGIN_MS),
    # the host's I/O pressure and the server's WAL fsyncs are load this test did not make
    # (tests/dashboard/test_guard_control.py reads them)
    "RETENTION_GUARD_IO_PRESSURE_SOURCE": "off",
    "RETENTION_GUARD_WAL_FSYNC_MS": "60000",
}
BUDGET = 2.0  # the policy's own inflation budget (guard.inflation_budget)


def spawn_drain(run_key: str, log) -> zygote.Started:
    """One worker process draining the run with two workers (threads, each with its own
    session): the controller's row is shared by them as by workers on many hosts. Forked from
    the test process's zygote (tests/zygote.py)."""
    return zygote.start(
        [
            sys.executable,
            *("manage.py", "retention", "drain", run_key, "--until-idle", "--workers", "2"),
        ],
        cwd=ROOT,
        env={**os.environ, **worker_env(), **WORKER_ENV},
        stdout=log,
    )


class LockLoad:
    """Foreground traffic that slows every read of the table: a session that takes its
    ACCESS EXCLUSIVE lock for 100 ms every 150 ms (as a migration-heavy deploy would)."""

    def __init__(self, table: str) -> None:
        self.table, self.stop = table, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        conn = pg_connect(autocommit=False, application_name="test-foreground-locks")
        try:
            while not self.stop.is_set():
                conn.execute(f"LOCK TABLE public.{self.table} IN ACCESS EXCLUSIVE MODE")
                time.sleep(0.1)
                conn.commit()
                time.sleep(0.05)
        finally:
            conn.rollback()
            conn.close()

    def __enter__(self) -> LockLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def draining(transactional_db, make_user, tmp_path):
    """A run of 150,000 rows paced to 1,000 rows/s (it outlasts the test), drained by a worker
    process of two workers."""
    create_events(150_000)
    policy = approved_policy(
        make_user,
        **events_spec(
            keep=[],
            chunking="key",
            pace_rows_per_s=1000,
            guard={"inflation_budget": BUDGET, "probe_p95_ms": 5000.0, "lock_waits": 1000},
        ),
    )
    run, _ = trigger_run(policy, tick=NOW)
    logs = [open(tmp_path / "worker.log", "w")]  # noqa: SIM115
    procs = [spawn_drain(run.run_key, log) for log in logs]
    try:
        yield policy, run
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
        for log in logs:
            log.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def steps_after(policy, step_id: int) -> list[GuardControlStep]:
    return list(GuardControlStep.objects.filter(policy=policy, id__gt=step_id).order_by("id"))


def history(policy) -> str:
    """The recorded steps, for a failure's message."""
    return "\n".join(
        f"{s.taken_at:%H:%M:%S.%f} {s.action:9} c={s.concurrency} ms={s.chunk_ms}"
        f" duty={s.duty_cycle} p99={s.probe_p99_ms} idle={s.baseline_ms} n={s.samples} {s.reason}"
        for s in GuardControlStep.objects.filter(policy=policy).order_by("id")
    )


def test_the_controller_lowers_concurrency_and_chunk_time_under_load_and_raises_them_after(
    draining,
):
    policy, run = draining
    spec = policy.approved_version.parsed
    ceilings = guard.ceilings_of(spec)
    assert (ceilings.concurrency, ceilings.chunk_ms) == (2, 300)

    # the workers learn the idle baseline and step up to the policy's concurrency: the test's
    # load starts from there (a machine busy with other work may have had the controller lower
    # the knobs for a while before; what the test's own load does is judged from a step above
    # them, whatever that other work made of the chunk time meanwhile)
    def above_the_floor():
        steps = GuardControlStep.objects.filter(policy=policy, baseline_ms__isnull=False)
        last = GuardControlStep.objects.filter(policy=policy).order_by("-id").first()
        if steps.count() < 2 or last is None or last.baseline_ms is None:
            return None
        up = last.concurrency == ceilings.concurrency and last.action != guard.FOREGROUND
        return last if up else None

    before = wait_for(
        above_the_floor,
        timeout=90,
        what=lambda: f"steps with an idle baseline at the policy's concurrency:\n{history(policy)}",
    )

    with LockLoad("rr_events"):
        lowest = wait_for(
            lambda: next(
                (
                    s
                    for s in steps_after(policy, before.id)
                    if s.action in (guard.DECREASE, guard.FLOOR)
                    and s.concurrency == 1
                    and s.chunk_ms < before.chunk_ms
                ),
                None,
            ),
            timeout=60,
            what=lambda: f"the controller to lower concurrency and chunk time:\n{history(policy)}",
        )
    loaded = steps_after(policy, before.id)
    lowered = [s for s in loaded if s.action in (guard.DECREASE, guard.FLOOR)]
    assert lowered, [(s.action, s.reason) for s in loaded]
    for step in lowered:
        assert step.inflation > BUDGET and step.budget == BUDGET
        assert (
            "> limit " in step.reason
            and f"(max({BUDGET:g} × idle, idle + {MARGIN_MS} ms))" in step.reason
        )
    assert lowest.duty_cycle < ceilings.duty_cycle
    assert Run.objects.get(pk=run.pk).state == Run.State.ACTIVE

    # the load is gone: the probe is back near its idle value and the knobs go back up
    raised = wait_for(
        lambda: next(
            (
                s
                for s in steps_after(policy, lowest.id)
                if s.action == guard.INCREASE
                and s.concurrency == 2
                and s.chunk_ms > lowest.chunk_ms
            ),
            None,
        ),
        # a busy machine's own spikes may hold it at the floor a while longer: a bound, not a
        # measure
        timeout=90,
        what=lambda: f"the controller to raise concurrency and chunk time:\n{history(policy)}",
    )
    assert raised.inflation <= BUDGET or raised.probe_p99_ms <= raised.baseline_ms + 5
    # the limit in ms as the reasons write it: two decimals under 100 ms, whole ms above (an
    # idle p99 a busy machine lifts over 50 ms makes a limit over 100 ms)
    ms = raised.limit_ms
    shown = f"{ms:.2f}".rstrip("0").rstrip(".") if ms < 100 else f"{ms:.0f}"
    assert (
        f"within limit {shown} ms (max({BUDGET:g} × idle, idle + {MARGIN_MS} ms))" in raised.reason
    )

    # the shared row holds the latest step, and the surfaces read it
    row = GuardControl.objects.get(policy=policy)
    assert row.stepped_at >= raised.taken_at
    summary = guard.control_summary(policy)
    assert summary["budget"] == BUDGET and summary["concurrency_ceiling"] == 2
    signals = guard.current_state(policy)["signals"]
    assert signals["probe_p99_inflation"]["threshold"] == BUDGET
    assert signals["control_concurrency"]["value"] == summary["concurrency"]
