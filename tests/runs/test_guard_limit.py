"""The foreground's limit as the team states it, driving the latency controller of a real
worker process's two workers on a real table, asserted on the controller's recorded steps
(never on timings):

- a limit every setting holds (absolute or relative) takes the knobs from the floor to the
  policy's own setting — the static setting known to hold it, since every period the steps
  judged was within it — in a few periods;
- a limit nothing can hold (absolute or relative) keeps them at the floor;
- a foreground the test slows deterministically (it holds the table's ACCESS EXCLUSIVE lock:
  the probe waits on it, and no chunk runs) is reported as over its budget on its own, with
  admission closed; once the lock goes (a step down of the foreground) admission opens again
  within a few control periods and chunks commit.

Load the test did not create moves the probe's readings but not these outcomes: the loose
limits are far above anything a busy machine does to a probe (seconds), the tight ones below
anything any machine can do (0.1 ms, or 1.01 × idle with no margin)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs import forecast
from runs.actions import trigger_run
from runs.engine import guard
from runs.models import AuditRecord, GuardControl, GuardControlStep
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events, worker_env
from tests.runs.processes import pg_connect, wait_for

pytestmark = pytest.mark.processes

WORKER_ENV = {
    "RETENTION_GUARD_SAMPLE_MS": "200",
    "RETENTION_GUARD_CONTROL_PERIOD_MS": "500",
    # the host's I/O pressure and the server's WAL fsyncs are load these tests did not make:
    # the limit is what they judge (tests/dashboard/test_guard_control.py reads those signals)
    "RETENTION_GUARD_IO_PRESSURE_SOURCE": "off",
    "RETENTION_GUARD_WAL_FSYNC_MS": "60000",
}


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


def history(policy) -> str:
    """The recorded steps, for a failure's message."""
    return "\n".join(
        f"{s.taken_at:%H:%M:%S.%f} {s.action:15} c={s.concurrency} ms={s.chunk_ms}"
        f" duty={s.duty_cycle} p99={s.probe_p99_ms} limit={s.limit_ms} n={s.samples} {s.reason}"
        for s in GuardControlStep.objects.filter(policy=policy).order_by("id")
    )


ROWS = 150_000
# fewer rows than this left under the policy's cutoff (20 days): the table is built again, so
# that every test's run outlasts it (a test on a busy machine may drain tens of thousands)
MIN_ELIGIBLE = 50_000


@pytest.fixture(scope="module")
def events_table(django_db_setup, django_db_blocker):
    """``events_table()``: ``public.rr_events`` of 150,000 rows, built once for the module and
    again only when an earlier test's run left too few of its rows to drain (each run drains
    a few thousand, paced to 1,000 rows/s)."""

    def ensure() -> None:
        with connection.cursor() as cur:
            cur.execute("SELECT to_regclass('public.rr_events') IS NOT NULL")
            if cur.fetchone()[0]:
                cur.execute(
                    "SELECT count(*) FROM public.rr_events WHERE occurred_at < %s",
                    [NOW - timedelta(days=20)],
                )
                if cur.fetchone()[0] >= MIN_ELIGIBLE:
                    return
        create_events(ROWS)

    yield ensure
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


@pytest.fixture
def drain_with(events_table, transactional_db, make_user, tmp_path):
    """``drain_with(limit)``: a run of the module's table paced to 1,000 rows/s (it outlasts
    the test) of a policy whose ``[guard]`` states ``limit``, drained by a worker process of
    two workers."""
    procs, logs = [], []

    def start(limit: dict):
        events_table()
        policy = approved_policy(
            make_user,
            **events_spec(
                keep=[],
                chunking="key",
                pace_rows_per_s=1000,
                # the absolute thresholds out of the way: the limit alone is under test
                guard={
                    "probe_p95_ms": 5000.0,
                    "critical_probe_p95_ms": 10_000.0,
                    "lock_waits": 1000,
                    "critical_lock_waits": 10_000,
                    **limit,
                },
            ),
        )
        run, _ = trigger_run(policy, tick=NOW)
        logs.append(open(tmp_path / "worker.log", "w"))  # noqa: SIM115
        procs.append(spawn_drain(run.run_key, logs[-1]))
        return policy, run

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=30)
    for log in logs:
        log.close()


LOOSE = {
    "absolute": {"fg_p99_ms": 5000.0},
    "relative": {"inflation": 100.0, "margin_ms": 5000.0},
}
TIGHT = {
    "absolute": {"fg_p99_ms": 0.1},
    "relative": {"inflation": 1.01, "margin_ms": 0.0},
}


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_a_limit_every_setting_holds_takes_the_knobs_from_the_floor_to_the_policys_own(
    drain_with, kind
):
    policy, _run = drain_with(LOOSE[kind])
    spec = policy.approved_version.parsed
    top = guard.ceilings_of(spec)
    at_top = wait_for(
        lambda: (
            GuardControlStep.objects.filter(
                policy=policy,
                concurrency=top.concurrency,
                chunk_ms=top.chunk_ms,
                duty_cycle=top.duty_cycle,
            )
            .order_by("id")
            .first()
        ),
        timeout=90,
        what=lambda: f"the controller to reach the policy's own settings:\n{history(policy)}",
    )
    steps = list(GuardControlStep.objects.filter(policy=policy, id__lte=at_top.id).order_by("id"))
    assert steps[0].action == guard.START
    assert (steps[0].concurrency, steps[0].chunk_ms) == (1, top.chunk_ms_floor), history(policy)
    judged = [s for s in steps if s.limit_ms is not None and s.probe_p99_ms is not None]
    assert judged, history(policy)
    # every period judged was within the limit, judged in ms, and the reason says which limit
    for step in judged:
        assert step.probe_p99_ms <= step.limit_ms, history(policy)
        assert "within limit" in step.reason, history(policy)
        if kind == "absolute":
            assert step.limit_ms == 5000.0 and "(fg_p99_ms)" in step.reason
        else:
            assert step.limit_ms >= 5000.0 and "max(100 × idle, idle + 5000 ms)" in step.reason
    # never a decrease for the latency, which every period kept; the only decrease there can
    # be is the back-off before a write-back, on the host's WAL fsync and I/O signals, which a
    # busy machine moves and this test does not
    for step in steps:
        if step.action == guard.DECREASE:
            assert "backing off before the write-back" in step.reason, history(policy)
    assert {s.action for s in steps} <= {guard.START, guard.INCREASE, guard.HOLD, guard.DECREASE}
    # from the floor to the policy's own setting: the additive increase, period by period
    assert sum(s.action == guard.INCREASE for s in steps) >= 2
    # the pages' figures are the controller's: the measured p99 beside its limit in ms
    row = GuardControl.objects.get(policy=policy)
    shown = guard.current_state(policy)["signals"]["fg_p99_ms"]
    assert (shown["value"], shown["threshold"]) == (row.probe_p99_ms, row.limit_ms)


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_a_limit_nothing_holds_keeps_the_knobs_at_the_floor_and_says_so(drain_with, kind):
    """Over the limit at the floor the controller says so; its chunks then wait a period, and a
    foreground still over the limit with nothing in flight is reported as over it on its own
    (an absolute limit of 0.1 ms is: no probe of a read and a durable commit is that fast)."""
    policy, _run = drain_with(TIGHT[kind])
    top = guard.ceilings_of(policy.approved_version.parsed)
    over = (guard.FLOOR, guard.FOREGROUND)
    wait_for(
        lambda: (
            GuardControlStep.objects.filter(policy=policy, action__in=over).count() >= 2 or None
        ),
        timeout=90,
        what=lambda: f"two steps over the limit at the floor:\n{history(policy)}",
    )
    steps = list(GuardControlStep.objects.filter(policy=policy).order_by("id"))
    for step in steps:
        if step.action not in over:
            continue
        assert step.probe_p99_ms > step.limit_ms, history(policy)
        assert (step.concurrency, step.chunk_ms) == (1, top.chunk_ms_floor), history(policy)
        if step.action == guard.FLOOR:
            assert step.reason.startswith("over the budget at the controller's minimum")
        else:
            assert step.reason.startswith("the foreground is over its budget on its own")
        if kind == "absolute":
            assert "> limit 0.1 ms (fg_p99_ms)" in step.reason, history(policy)
        else:
            assert "(max(1.01 × idle, idle + 0 ms))" in step.reason, history(policy)
    if kind == "absolute":
        assert not [s for s in steps if s.action == guard.INCREASE], history(policy)


def test_a_foreground_over_its_limit_with_no_chunk_in_flight_is_not_cleanups_doing(drain_with):
    """The test holds the table's ACCESS EXCLUSIVE lock: the probe's read waits on it (to its
    1 s timeout) and no chunk runs. The controller reports the foreground over its budget on
    its own, the status and the drain window say so, admission stays closed; once the lock is
    released (the foreground steps down) admission opens within a few control periods."""
    policy, _run = drain_with({"fg_p99_ms": 500.0})
    wait_for(
        lambda: GuardControlStep.objects.filter(policy=policy, action=guard.INCREASE).exists(),
        timeout=90,
        what=lambda: f"a step within the limit before the lock:\n{history(policy)}",
    )
    holder = pg_connect(autocommit=False, application_name="test-foreground-lock")
    try:
        holder.execute("SET lock_timeout = '30s'")
        holder.execute("LOCK TABLE public.rr_events IN ACCESS EXCLUSIVE MODE")
        locked_at = timezone.now()
        own = wait_for(
            lambda: (
                GuardControlStep.objects.filter(
                    policy=policy, action=guard.FOREGROUND, taken_at__gt=locked_at
                )
                .order_by("id")
                .first()
            ),
            timeout=60,
            what=lambda: f"a step saying the foreground is over on its own:\n{history(policy)}",
        )
        assert own.reason.startswith("the foreground is over its budget on its own: ")
        assert "> limit 500 ms (fg_p99_ms)" in own.reason
        assert own.probe_p99_ms > 500.0 and own.limit_ms == 500.0
        # with the lock held no chunk of the policy can commit
        assert not AuditRecord.objects.filter(
            policy_slug=policy.slug, committed_at__gt=locked_at, committed_at__lte=own.taken_at
        ).exists()
        state = guard.current_state(policy)
        assert state["level"] == "throttled"
        assert any(
            r.startswith("the foreground is over its budget on its own") for r in state["reasons"]
        )
        assert state["latency"]["on_its_own"] and state["latency"]["limit_ms"] == 500.0
        window = forecast.drain_window(policy, fresh=True)
        assert window["foreground_over"]
        assert window["explanation"].startswith(
            "admission closed: the foreground is over its budget on its own (no chunk in flight)"
        )
        holder.commit()  # the foreground steps down
        released_at = timezone.now()
    finally:
        holder.rollback()
        holder.close()
    # admission opens again within a few control periods (half a second each here): a chunk
    # commits
    committed = wait_for(
        lambda: (
            AuditRecord.objects.filter(policy_slug=policy.slug, started_at__gt=released_at)
            .order_by("committed_at")
            .first()
        ),
        timeout=30,
        what=lambda: f"a chunk after the lock was released:\n{history(policy)}",
    )
    after = list(
        GuardControlStep.objects.filter(
            policy=policy, taken_at__gt=released_at, taken_at__lte=committed.started_at
        ).order_by("id")
    )
    # the step that reopened admission judged the foreground within its limit again, a few
    # control periods after the release
    assert after and after[-1].action != guard.FOREGROUND, history(policy)
    assert len(after) <= 5, history(policy)
