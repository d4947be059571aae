"""The admission guard: throttles with a reason, pauses at critical levels, resumes by itself."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time

import psycopg
import pytest
from django.db import connection

from core.models import OperatorAction
from retention.models import Policy
from runs.actions import trigger_run
from runs.engine import guard, planner, worker
from runs.models import Chunk, GuardSample, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import pg_connect


def make_policy(make_user, **guard_overrides):
    return approved_policy(make_user, **events_spec(keep=[], guard=guard_overrides))


def fake_sample(spec, **values) -> GuardSample:
    base = {"lock_waits": 0, "replication_lag_s": 0.0, "connections_free": 100, "wal_mb_per_s": 0.0}
    base.update(values.pop("instance", {}))
    return GuardSample.objects.create(values=base, tables={spec.qualified_table: values})


@pytest.fixture
def policy(db, make_user):
    create_events(2000)
    return make_policy(make_user, lock_waits=10)


def test_a_signal_over_its_threshold_names_value_and_threshold(policy):
    spec = policy.approved_version.parsed
    verdict = guard.evaluate(spec, fake_sample(spec, instance={"lock_waits": 14}))
    assert not verdict.admit
    assert verdict.reason == "lock waits 14 > 10"
    assert not verdict.critical


def test_signals_within_thresholds_admit(policy):
    spec = policy.approved_version.parsed
    verdict = guard.evaluate(spec, fake_sample(spec, probe_ms=1.0, dead_tuple_ratio=0.1))
    assert verdict.admit
    assert verdict.signals["lock_waits"]["threshold"] == 10


def test_a_critical_level_pauses_the_policy_and_raises_an_alert(policy):
    spec = policy.approved_version.parsed
    run, _ = trigger_run(policy, tick=NOW)
    fake_sample(spec, instance={"lock_waits": 500})
    verdict = guard.admission(run, spec)
    policy.refresh_from_db()
    assert verdict.critical
    assert policy.paused
    assert "critical" in policy.paused_reason
    alert = OperatorAction.objects.get(action="policy.pause", actor="guard")
    assert alert.details["alert"] is True
    assert guard.current_state(Policy.objects.get(pk=policy.pk))["level"] == "critical"


@pytest.fixture
def committed_policy(transactional_db, make_user):
    create_events(2000)
    yield make_policy(make_user, lock_waits=10)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_a_lock_held_on_the_target_admits_no_chunk_and_says_so(committed_policy):
    run, _ = trigger_run(committed_policy, tick=NOW)
    planner.plan(run)
    foreground = pg_connect(autocommit=False, application_name="foreground")
    foreground.execute("LOCK TABLE public.rr_events IN SHARE MODE")
    try:
        guard.sample(force=True)
        outcome = worker.process_one(Run.objects.get(pk=run.pk))
        assert outcome.kind == worker.THROTTLED
        assert outcome.reason.startswith("lock held on public.rr_events: ShareLock by pid")
        chunk = Chunk.objects.get(pk=outcome.chunk_id)
        assert chunk.throttle_reason == outcome.reason
        assert chunk.state == Chunk.State.PENDING
    finally:
        foreground.rollback()
        foreground.close()
    # the pressure ended: the next sample admits, and the run drains without an operator
    guard.sample(force=True)
    Chunk.objects.filter(run=run).update(not_before=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED


@pytest.mark.django_db(transaction=True)
def test_one_sampler_at_a_time_for_the_whole_pool(make_user):
    create_events(500)
    make_policy(make_user)
    GuardSample.objects.all().delete()
    barrier = threading.Barrier(6)

    def take():
        barrier.wait()
        try:
            guard.sample()
        finally:
            connection.close()

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert GuardSample.objects.count() == 1
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_chunk_size_halves_under_pressure_and_grows_toward_half_the_target_in_proportion(policy):
    run, _ = trigger_run(policy, tick=NOW)
    assert policy.approved_version.parsed.target_chunk_ms == 300
    assert policy.approved_version.parsed.chunk_size == 200
    assert worker.adapt_chunk_size(run, None) == 100
    # far under the target: toward half of it in one step, 8× at most
    assert worker.adapt_chunk_size(run, 0.001) == 800
    assert worker.adapt_chunk_size(run, 0.03) == 3200  # 150 ms / 30 ms = 5×, at the ceiling
    assert worker.adapt_chunk_size(run, 5.0) == 1600
    assert worker.adapt_chunk_size(run, 0.1) == 2400  # 150 ms / 100 ms: 1.5×
    assert worker.adapt_chunk_size(run, 0.2) == 2400  # near it: stays
    assert worker.adapt_chunk_size(run, None) == 1200
    assert worker.adapt_chunk_size(run, None) == 600
    # just over an eighth of it (a run's first chunk, slowed by a cold backend): still ~4×
    assert worker.adapt_chunk_size(run, 0.039) == 2308  # 150 ms / 39 ms = 3.85×
    assert worker.adapt_chunk_size(run, 0.14) == 2539  # just under half of it: +10% at least
    for _ in range(200):
        worker.adapt_chunk_size(run, 0.001)
    assert Run.objects.get(pk=run.pk).chunk_size == 3200  # the ceiling: 16 × the policy's size


def test_workers_step_the_runs_one_chunk_size_from_the_chunks_they_measured(policy):
    """Two workers drain one run, each with its own copy of the run: a step moves the stored
    size, never overwrites it with a worker's stale copy, and steps from the chunk it measured."""
    run, _ = trigger_run(policy, tick=NOW)
    first, second = (Run.objects.select_related("policy_version").get(pk=run.pk) for _ in "ab")

    def stored() -> int:
        return Run.objects.get(pk=run.pk).chunk_size

    # the first worker's first chunk (200 keys, the policy's size) was fast: 8×
    assert worker.adapt_chunk_size(first, 0.001, 200) == 1600
    # the second worker's first chunk, planned at 200 too, was slower (30 ms: 5×): the size
    # the first one set stands, and the second worker's copy learns it
    assert worker.adapt_chunk_size(second, 0.03, 200) == 1600
    assert second.chunk_size == 1600 and stored() == 1600
    # a chunk planned at 1600 over the target: half of it
    assert worker.adapt_chunk_size(second, 1.0, 1600) == 800
    # the guard throttles the second worker: half of what is stored
    assert worker.adapt_chunk_size(second, None) == 400
    # the first worker, still holding 1600, finishes a chunk of 1600 well under the target
    # (100 ms: 1.5×): half as much again as the stored 400, not as its copy
    assert worker.adapt_chunk_size(first, 0.1, 1600) == 600
    assert stored() == 600
    # the planner plans at the stored size whatever a worker's copy says
    assert worker.adapt_chunk_size(second, None) == 300
    first.chunk_size = 3200
    planner.plan(first, window=2)
    assert first.chunk_size == 300
    assert max(c.planned_rows for c in Chunk.objects.filter(run=run)) == 300


def test_the_planner_keeps_fewer_chunks_ahead_as_they_grow_past_four_times_the_policys_size(
    policy,
):
    run, _ = trigger_run(policy, tick=NOW)
    # at the policy's size, before a chunk is measured: one chunk for each of two workers
    assert run.chunk_size == 200 and worker.planning_window(run, 32, measured=False) == 2
    assert worker.planning_window(run, 1, measured=False) == 1
    run.chunk_size = 400  # another size, not yet measured: a quarter of the window
    assert worker.planning_window(run, 32, measured=False) == 8
    sizes = {200: 32, 800: 32, 1600: 16, 3200: 8}
    for size, ahead in sizes.items():
        run.chunk_size = size
        assert worker.planning_window(run, 32, measured=True) == ahead
    assert worker.planning_window(run, 64, measured=True) == 16
    assert worker.planning_window(run, 2, measured=True) == 2  # never over the window
    # until the size is measured, a quarter of that: after a jump to 8×, four chunks ahead
    run.chunk_size = 1600
    assert worker.planning_window(run, 32, measured=False) == 4
    run.chunk_size = 3200
    assert worker.planning_window(run, 32, measured=False) == 2


def test_a_jump_of_the_size_unsettles_it_and_a_chunk_of_the_new_size_settles_it(policy):
    run, _ = trigger_run(policy, tick=NOW)
    run = Run.objects.select_related("policy_version").get(pk=run.pk)
    sizing = worker.SizeSettling()

    def done(planned: int, seconds: float) -> worker.Outcome:
        return worker.Outcome(worker.DONE, planned=planned, seconds=seconds)

    sizing.step(run, done(200, 0.001))  # the policy's 200 keys, fast: 8×
    assert (run.chunk_size, sizing.measured) == (1600, False)
    sizing.step(run, done(200, 0.001))  # planned before the jump: tells nothing of 1600
    assert (run.chunk_size, sizing.measured) == (1600, False)
    sizing.step(run, done(1600, 0.1))  # a chunk of 1600 keys under half the target: 1.5×
    assert (run.chunk_size, sizing.measured) == (2400, True)
    sizing.step(run, done(2400, 0.01))  # far under it: up to the ceiling, under 2×: measured
    assert (run.chunk_size, sizing.measured) == (3200, True)
    sizing.step(run, done(3200, 1.0))  # over the target: halved, measured
    assert (run.chunk_size, sizing.measured) == (1600, True)


@pytest.mark.django_db(transaction=True)
def test_lock_waits_count_in_this_database_only():
    """Sessions waiting on locks in another database of the same server are not a sign of
    harm done here; those of this database are."""
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params["application_name"] = "test-foreground"  # not one of the product's own sessions
    other = f"rr_other_{secrets.token_hex(4)}"
    admin = psycopg.connect(**params, autocommit=True)
    admin.execute(f'CREATE DATABASE "{other}"')
    try:
        in_other = {**params, "dbname": other}
        with psycopg.connect(**in_other, autocommit=True) as setup:
            setup.execute("CREATE TABLE held (id int)")
        with _one_waiting(admin, other, "held", lambda: psycopg.connect(**in_other)):
            assert _instance_lock_waits() == 0
        create_events(10)
        here = connection.settings_dict["NAME"]
        with _one_waiting(admin, here, "public.rr_events", lambda: pg_connect(autocommit=False)):
            assert _instance_lock_waits() == 1
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
        admin.close()


def _instance_lock_waits() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT lock_waits FROM guard_instance_signals()")
        return cur.fetchone()[0]


@contextlib.contextmanager
def _one_waiting(admin, database: str, table: str, connect):
    """One session of ``database`` holds ``table`` exclusively while another waits to read it."""
    holder, waiter = connect(), connect()
    holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    thread = threading.Thread(target=lambda: waiter.execute(f"SELECT 1 FROM {table}").fetchall())
    thread.start()
    try:
        deadline = time.monotonic() + 10
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = %s"
        )
        while not admin.execute(query, [database]).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert admin.execute(query, [database]).fetchone()[0] == 1
        yield
    finally:
        holder.rollback()
        thread.join(10)
        holder.close()
        waiter.close()


def test_under_the_duty_cycle_each_chunk_is_followed_by_its_share_of_idle_time(policy):
    """A chunk admitted under the duty cycle is followed by a pause of its worker, so that the
    chunks fill the duty cycle chunk by chunk (spread evenly through the time) instead of back
    to back until the duty window fills: time × (chunks at once ÷ duty cycle − 1)."""
    spec = policy.approved_version.parsed
    floor = guard.Verdict(True, paced=True, concurrency=1, duty_cycle=0.1)
    assert guard.pause_after(spec, floor, 0.05) == pytest.approx(0.45)
    # two chunk transactions at once share the duty cycle: each worker fills half of it
    two = guard.Verdict(True, paced=True, concurrency=2, duty_cycle=0.5)
    assert guard.pause_after(spec, two, 0.1) == pytest.approx(0.3)
    # the configured duty cycle caps the controller's
    assert guard.pause_after(spec, guard.Verdict(True, paced=True, concurrency=1), 0.1) == (
        pytest.approx(0.1)
    )
    # not paced (no pressure, the controller at its ceiling), or refused: no pause
    assert guard.pause_after(spec, guard.Verdict(True, concurrency=1, duty_cycle=0.1), 0.1) == 0
    assert guard.pause_after(spec, guard.Verdict(False, paced=True, duty_cycle=0.1), 0.1) == 0
