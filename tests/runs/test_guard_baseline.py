"""The guard against the probe's own idle baseline: CPU contention that lifts a 1 ms probe to
20 ms is pressure even below the absolute threshold; under it the guard paces chunks to a duty
cycle instead of stopping them."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from psycopg import sql

from core import locks
from runs.actions import trigger_run
from runs.engine import guard, planner, worker
from runs.models import AuditRecord, Chunk, GuardControl, GuardSample, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import pg_connect

TABLE = "public.rr_events"


def make_policy(make_user):
    return approved_policy(make_user, **events_spec(keep=[], guard={"lock_waits": 10}))


def probe_sample(probe_ms: float, *, in_flight: bool = False, ahead_s: float = 0.0) -> GuardSample:
    """A sample of a quiet instance whose probe read ``probe_ms``. ``ahead_s`` dates it in the
    future, so it stays the latest (fresh) sample for the whole test and no real one replaces it."""
    values = {
        "lock_waits": 0,
        "replication_lag_s": 0.0,
        "connections_free": 100,
        "wal_mb_per_s": 0.0,
    }
    return GuardSample.objects.create(
        taken_at=timezone.now() + timedelta(seconds=ahead_s),
        values=values,
        tables={TABLE: {"probe_ms": probe_ms, "in_flight": in_flight, "dead_tuple_ratio": 0.0}},
    )


def idle_then_inflated(inflated_ms: float = 20.0, *, idle_ms: float = 1.0) -> None:
    for _ in range(6):
        probe_sample(idle_ms)
    probe_sample(15.0, in_flight=True)  # a chunk in flight: not part of the baseline
    probe_sample(inflated_ms, in_flight=True, ahead_s=120)


def planned_run_at_baseline(policy) -> Run:
    """A planned run of ``policy`` whose probe reads its idle baseline of 1 ms (the latest
    sample dated ahead, so that it stays the fresh one for the whole test)."""
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(6):
        probe_sample(1.0)
    probe_sample(1.0, ahead_s=120)
    return run


@pytest.fixture
def committed_policy(transactional_db, make_user):
    create_events(2000)
    yield make_policy(make_user)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


@pytest.fixture(autouse=True)
def relative_limit(settings):
    """The relative limit these tests were written for: 1.5 × idle with a 1 ms margin (the
    product's default is 2 × and 5 ms)."""
    settings.RETENTION = {
        **settings.RETENTION,
        "GUARD_PROBE_RATIO": 1.5,
        "GUARD_PROBE_MARGIN_MS": 1,
    }


@pytest.fixture
def uncontrolled(settings):
    """Without the latency controller the probe's p95 against its idle p95 paces chunks per
    sample (with it, the controller's step alone judges the foreground's latency)."""
    settings.RETENTION = {**settings.RETENTION, "GUARD_CONTROL": False}


@pytest.fixture
def hard_stop(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD_DUTY_CYCLE": 0.0}


def test_a_probe_inflated_over_its_idle_baseline_throttles_and_names_the_baseline(
    db, make_user, hard_stop, uncontrolled
):
    create_events(500)
    policy = make_policy(make_user)
    spec = policy.approved_version.parsed
    idle_then_inflated(20.0, idle_ms=4.0)  # 20 ms: under the absolute 25 ms threshold
    verdict = guard.evaluate(spec, GuardSample.objects.order_by("-taken_at").first())
    assert not verdict.admit
    assert not verdict.critical
    assert verdict.reason == "probe p95 20 ms > 1.5 × idle baseline 4 ms (p95 of 6 idle samples)"
    assert verdict.signals["probe_baseline_ms"]["value"] == 4.0

    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    outcome = worker.process_one(Run.objects.get(pk=run.pk))
    assert outcome.kind == worker.THROTTLED
    assert "idle baseline 4 ms" in outcome.reason
    assert Chunk.objects.get(pk=outcome.chunk_id).throttle_reason == outcome.reason


def test_the_absolute_thresholds_judge_the_probes_read_and_the_baseline_its_commit_too(
    db, make_user, hard_stop, uncontrolled
):
    """A commit's latency depends on the storage: 40 ms of a slow fsync is not over the read's
    absolute 25 ms, but it is over the probe's own idle baseline, which the same server's
    commits make."""
    create_events(500)
    spec = make_policy(make_user).approved_version.parsed
    for _ in range(6):
        probe_sample(2.0)
    slow = GuardSample.objects.create(
        taken_at=timezone.now() + timedelta(seconds=120),
        values={"lock_waits": 0, "replication_lag_s": 0.0, "connections_free": 100},
        tables={TABLE: {"probe_ms": 40.0, "probe_read_ms": 1.0, "in_flight": True}},
    )
    verdict = guard.evaluate(spec, slow)
    # the reads' p95 over the window (the idle samples read 2 ms), not the 40 ms commit
    assert verdict.signals["probe_p95_ms"]["value"] == 2.0
    assert verdict.signals["probe_p95_vs_idle"]["value"] == 40.0  # read and commit
    assert not verdict.admit and not verdict.critical
    assert verdict.reason == "probe p95 40 ms > 1.5 × idle baseline 2 ms (p95 of 6 idle samples)"


def test_a_probe_near_its_baseline_admits_and_a_millisecond_margin_applies(
    db, make_user, hard_stop, uncontrolled
):
    create_events(500)
    spec = make_policy(make_user).approved_version.parsed
    for _ in range(6):
        probe_sample(1.0)
    verdict = guard.evaluate(
        spec, probe_sample(1.9, in_flight=True)
    )  # 1.9 × a 1 ms baseline, within 1 ms of it
    assert verdict.admit, verdict.reason
    verdict = guard.evaluate(spec, probe_sample(2.5, in_flight=True))
    assert verdict.reason == "probe p95 2.5 ms > idle baseline 1 ms + 1 ms (p95 of 6 idle samples)"


def test_the_idle_baseline_is_learnt_from_samples_with_no_chunk_in_flight(
    committed_policy, settings
):
    # a margin no jitter of a shared machine reaches: every idle reading joins the baseline
    settings.RETENTION = {**settings.RETENTION, "GUARD_PROBE_MARGIN_MS": 60_000}
    trigger_run(committed_policy, tick=NOW)  # an active run: its table is sampled
    GuardSample.objects.all().delete()
    for _ in range(3):
        guard.sample(force=True)
    latest = GuardSample.objects.order_by("-taken_at").first()
    assert latest.tables[TABLE]["in_flight"] is False
    baseline = guard.idle_baseline(TABLE)
    # the first sample took the missing idle probes (its own, perhaps cold, probe is not part
    # of the baseline); the two after it one probe each
    assert baseline["n"] == guard.IDLE_PROBES + 2
    probes = [
        v
        for s in GuardSample.objects.all()
        for v in [
            *([] if "not_baseline" in s.tables[TABLE] else [s.tables[TABLE]["probe_ms"]]),
            *s.tables[TABLE].get("idle_probes_ms", []),
        ]
    ]
    assert len(probes) == baseline["n"]
    assert baseline["p95"] == pytest.approx(
        sorted(probes)[round(0.95 * (len(probes) - 1))], abs=0.01
    )
    shown = guard.current_state(committed_policy)["signals"]["probe_baseline_ms"]
    assert shown["value"] == baseline["p95"]

    # a chunk transaction of the product in flight on the target: that sample is not idle
    cleanup = pg_connect(autocommit=False, application_name="retention:cleanup")
    try:
        cleanup.execute("DELETE FROM public.rr_events WHERE id < 0")
        guard.sample(force=True)
    finally:
        cleanup.rollback()
        cleanup.close()
    latest = GuardSample.objects.order_by("-taken_at").first()
    assert latest.tables[TABLE]["in_flight"] is True
    assert guard.idle_baseline(TABLE)["n"] == guard.IDLE_PROBES + 2


def test_too_few_idle_samples_learn_no_baseline(db, make_user):
    create_events(500)
    spec = make_policy(make_user).approved_version.parsed
    probe_sample(1.0)
    verdict = guard.evaluate(spec, probe_sample(20.0, in_flight=True))
    assert verdict.admit  # one idle sample is no baseline: only the absolute threshold applies
    assert verdict.signals["probe_baseline_ms"]["value"] is None


def test_the_duty_cycle_limits_admissions_while_the_foreground_is_inflated(
    committed_policy, settings, uncontrolled
):
    settings.RETENTION = {
        **settings.RETENTION, "GUARD_DUTY_CYCLE": 1e-6, "GUARD_DUTY_WINDOW_S": 60,
    }  # fmt: skip
    run, _ = trigger_run(committed_policy, tick=NOW)
    planner.plan(run)
    spec = committed_policy.approved_version.parsed
    idle_then_inflated(20.0)
    # inflated, but no chunk time in the window yet: paced, not stopped
    first = worker.process_one(Run.objects.get(pk=run.pk))
    assert first.kind == worker.DONE
    record = AuditRecord.objects.get(run=run)
    assert guard.duty_cycle(spec, now=record.committed_at) > 0

    # the chunk's time fills the duty cycle: the next chunk waits, and the reason says why
    second = worker.process_one(Run.objects.get(pk=run.pk))
    assert second.kind == worker.THROTTLED
    assert "idle baseline 1 ms" in second.reason
    assert "of the last 60 s in chunk transactions > duty cycle" in second.reason

    # once the window has moved past the chunk, the guard admits again
    later = record.committed_at + timedelta(seconds=61)
    assert guard.duty_cycle(spec, now=later) == 0
    assert guard.admission(Run.objects.get(pk=run.pk), spec, now=later).admit


def test_the_duty_cycle_does_not_apply_when_the_foreground_is_at_its_baseline(
    committed_policy, settings
):
    settings.RETENTION = {
        **settings.RETENTION, "GUARD_DUTY_CYCLE": 1e-6, "GUARD_DUTY_WINDOW_S": 60,
    }  # fmt: skip
    run = planned_run_at_baseline(committed_policy)
    outcomes = [worker.process_one(Run.objects.get(pk=run.pk)).kind for _ in range(3)]
    assert outcomes == [worker.DONE] * 3


def test_a_table_with_no_idle_baseline_learns_one_in_its_first_sample(committed_policy, settings):
    """A run on a table the guard has never sampled does not drain on absolute thresholds
    alone: its first sample with nothing in flight takes the missing idle probes at once."""
    # a margin no jitter of a shared machine reaches: every idle reading joins the baseline
    settings.RETENTION = {**settings.RETENTION, "GUARD_PROBE_MARGIN_MS": 60_000}
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    guard.sample(force=True)
    assert GuardSample.objects.count() == 1
    first = GuardSample.objects.get().tables[TABLE]
    assert len(first["idle_probes_ms"]) == guard.IDLE_PROBES
    assert first["not_baseline"] == "first probe"
    baseline = guard.idle_baseline(TABLE)
    assert baseline["n"] == guard.IDLE_PROBES
    assert baseline["p95"] is not None

    # a table that has its baseline takes no extra probes
    guard.sample(force=True)
    latest = GuardSample.objects.order_by("-taken_at").first()
    assert "idle_probes_ms" not in latest.tables[TABLE]
    assert guard.idle_baseline(TABLE)["n"] == guard.IDLE_PROBES + 1


def test_no_idle_probes_are_taken_while_a_chunk_is_in_flight(committed_policy):
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    cleanup = pg_connect(autocommit=False, application_name="retention:cleanup")
    try:
        cleanup.execute("DELETE FROM public.rr_events WHERE id < 0")
        guard.sample(force=True)
    finally:
        cleanup.rollback()
        cleanup.close()
    latest = GuardSample.objects.get()
    assert latest.tables[TABLE]["in_flight"] is True
    assert "idle_probes_ms" not in latest.tables[TABLE]
    assert guard.idle_baseline(TABLE) == {
        "p50": None, "p95": None, "p99": None, "n": 0, "at_rank": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "application, in_flight",
    [("retention:cleanup", True), ("retention:web", True), ("reporting", False)],
)
def test_a_read_of_the_product_on_the_table_is_in_flight_too(
    committed_policy, application, in_flight
):
    """Any work of the product on the target — the planner's reads of a window's bounds, the
    verification's count, a dashboard's preview, not only a chunk's DELETE — makes a sample's
    probe no idle reading: a read holding the table's ACCESS SHARE lock in a session of the
    product is in flight; the same read by the foreground is not."""
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    reader = pg_connect(autocommit=False, application_name=application)
    try:
        reader.execute("SELECT count(*) FROM public.rr_events WHERE id < 100")
        guard.sample(force=True)
    finally:
        reader.rollback()
        reader.close()
    latest = GuardSample.objects.get()
    assert latest.tables[TABLE]["in_flight"] is in_flight
    assert ("idle_probes_ms" in latest.tables[TABLE]) is not in_flight


def test_samples_are_reused_for_the_configured_interval(committed_policy, settings):
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    settings.RETENTION = {**settings.RETENTION, "GUARD_SAMPLE_MS": 60_000}
    first = guard.sample()
    assert guard.sample() == first
    settings.RETENTION = {**settings.RETENTION, "GUARD_SAMPLE_MS": 1}
    time_before = first.taken_at
    again = guard.sample()
    assert again.pk != first.pk and again.taken_at > time_before


def test_an_idle_reading_over_the_budget_of_the_idle_median_stays_out_of_the_baseline(
    committed_policy,
):
    """Foreground slowness with nothing of the product in flight is pressure, not a new normal:
    the baseline the controller judges against does not climb with it."""
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    guard.sample(force=True)
    before = guard.idle_baseline(TABLE)
    assert before["n"] == guard.IDLE_PROBES and before["p50"] is not None

    # a foreground session holds the table's ACCESS EXCLUSIVE lock until the probe has waited
    # 300 ms for it: far over 1.5 × the idle median and the 1 ms margin (counted from when
    # the probe waits, so a busy machine's slow start of the sample does not shorten it)
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN ACCESS EXCLUSIVE MODE")

    def release_after_the_probe_waited() -> None:
        with pg_connect(autocommit=True) as watcher:
            deadline = time.monotonic() + 30
            while (
                time.monotonic() < deadline
                and not watcher.execute(
                    "SELECT count(*) FROM pg_locks"
                    " WHERE relation = 'public.rr_events'::regclass AND NOT granted"
                ).fetchone()[0]
            ):
                time.sleep(0.005)
        time.sleep(0.3)
        blocker.commit()

    release = threading.Thread(target=release_after_the_probe_waited)
    release.start()
    try:
        slow = guard.sample(force=True)
    finally:
        release.join()
        blocker.close()
    reading = slow.tables[TABLE]
    assert reading["in_flight"] is False and reading["probe_ms"] >= 250
    assert reading["not_baseline"] == "over budget"
    assert guard.idle_baseline(TABLE) == before


def test_a_reading_right_after_a_chunk_committed_is_not_idle(committed_policy, settings):
    """Between two chunks nothing of the product is in flight, yet the CPU the last one left
    behind (its WAL, the next plan) is the run's own load: a reading within the idle gap after
    a commit is not part of the baseline, so a run cannot lift the baseline it is judged by."""
    settings.RETENTION = {
        **settings.RETENTION, "GUARD_PROBE_MARGIN_MS": 60_000, "GUARD_IDLE_GAP_MS": 60_000,
    }  # fmt: skip
    run, _ = trigger_run(committed_policy, tick=NOW)
    planner.plan(run)
    GuardSample.objects.all().delete()
    # the first admission finds no chunk committed yet: it learns the baseline from idle probes
    assert worker.process_one(Run.objects.get(pk=run.pk)).kind == worker.DONE
    before = guard.idle_baseline(TABLE)
    assert before["n"] == guard.IDLE_PROBES

    after = guard.sample(force=True).tables[TABLE]
    assert after["in_flight"] is False
    assert after["not_baseline"].startswith("a chunk committed ")
    assert "idle_probes_ms" not in after
    assert guard.idle_baseline(TABLE) == before

    # once the gap has passed, a reading with nothing in flight is idle again
    settings.RETENTION = {**settings.RETENTION, "GUARD_IDLE_GAP_MS": 0}
    later = guard.sample(force=True).tables[TABLE]
    assert "not_baseline" not in later
    assert guard.idle_baseline(TABLE)["n"] == guard.IDLE_PROBES + 1


def test_the_controllers_duty_cycle_paces_chunks_with_the_probe_at_its_baseline(
    committed_policy, settings
):
    """A duty cycle the controller lowered applies to every admission, not only while the probe
    reads over its baseline: the controller's decrease is what keeps the foreground's share."""
    settings.RETENTION = {
        **settings.RETENTION, "GUARD_DUTY_FLOOR": 1e-6, "GUARD_DUTY_WINDOW_S": 60,
    }  # fmt: skip
    run = planned_run_at_baseline(committed_policy)
    GuardControl.objects.create(
        policy=committed_policy,
        concurrency=1,
        chunk_ms=300,
        duty_cycle=1e-6,
        stepped_at=timezone.now() + timedelta(hours=1),  # no step during the test
        budget=1.5,
    )
    first = worker.process_one(Run.objects.get(pk=run.pk))
    assert first.kind == worker.DONE
    second = worker.process_one(Run.objects.get(pk=run.pk))
    assert second.kind == worker.THROTTLED
    assert second.reason.endswith("> duty cycle 0% (the latency controller's setting)")
    assert Chunk.objects.get(pk=second.chunk_id).throttle_reason == second.reason


def test_a_worker_with_no_recent_sample_waits_for_the_one_being_taken(committed_policy):
    """Two workers start a run after a quiet spell: the one that finds the other sampling (its
    first sample takes the idle probes) waits for that sample instead of admitting a chunk on a
    reading from before the run, or on none — a chunk in flight would spoil those probes."""
    trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    other = pg_connect(autocommit=False, application_name="retention:worker")
    other.execute("SELECT pg_advisory_xact_lock(%s, 0)", [locks.SAMPLER])
    other.execute(
        "INSERT INTO runs_guardsample (taken_at, values, tables)"
        " VALUES (clock_timestamp(), '{}', %s::jsonb)",
        ['{"public.rr_events": {"probe_ms": 0.5, "in_flight": false}}'],
    )
    done = threading.Timer(0.3, other.commit)
    done.start()
    try:
        seen = guard.sample()
    finally:
        done.join()
        other.close()
    assert seen is not None
    assert seen.tables == {TABLE: {"probe_ms": 0.5, "in_flight": False}}
    assert GuardSample.objects.count() == 1  # the other's, not one of its own


def test_the_probe_includes_a_durable_commit(committed_policy):
    """Cleanup slows the foreground's commits most (each chunk's WAL is flushed before a
    commit behind it can be), so the probe commits a WAL record durably, whatever the
    product's own sessions use: a WAL flush held back by 100 ms (``commit_delay``, for every
    new session of the database) shows in the probe, which a read alone would not see."""
    spec = committed_policy.approved_version.parsed
    database = sql.Identifier(connection.settings_dict["NAME"])

    def alter(setting: str) -> None:
        with connection.cursor() as cur:
            statement = sql.SQL("ALTER DATABASE {} " + setting).format(database)
            cur.execute(statement.as_string(cur.connection))

    alter("SET commit_delay = 100000")
    alter("SET commit_siblings = 0")
    try:
        guard.close_probe_connection()  # the next probe opens a session with the delay
        delayed = guard._probe_ms(spec)
    finally:
        alter("RESET commit_delay")
        alter("RESET commit_siblings")
        guard.close_probe_connection()
    assert delayed >= 100.0


def test_the_probe_session_takes_the_databases_own_connect_timeout(committed_policy, monkeypatch):
    """A ``DATABASE_URL`` with ``?connect_timeout=5`` puts the parameter in the connection's
    options: the probe's own session keeps it instead of failing on a second value (which
    made every probe unreadable)."""
    spec = committed_policy.approved_version.parsed
    params = connection.get_connection_params()
    monkeypatch.setattr(
        connection, "get_connection_params", lambda: {**params, "connect_timeout": 5}
    )
    guard.close_probe_connection()
    probe = guard._probe_ms(spec)
    assert probe is not None and probe < guard.PROBE_TIMEOUT_MS


def test_a_lost_probe_session_gives_no_reading_and_the_next_probe_opens_another(
    committed_policy,
):
    """A failover or a restart ends the probe's session: that probe reports nothing (a made-up
    1 s reading would pass for pressure, or be learnt as the idle baseline) and the next one
    works on a new session."""
    spec = committed_policy.approved_version.parsed
    assert guard._probe_ms(spec) is not None  # the thread's session is open
    lost = guard._probe_connection().info.backend_pid
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [lost])
    assert guard._probe_ms(spec) is None
    assert guard._probe_ms(spec) is not None
    assert guard._probe_connection().info.backend_pid != lost


def test_a_leases_first_act_is_the_guards_sample_before_it_plans(
    committed_policy, monkeypatch, settings
):
    """A run's idle baseline is learnt before any of its work is in flight: a lease takes the
    guard's sample (its idle probes, the table having no baseline) before it plans its first
    window — not beside the planner's reads and the read above the last key, which lifted it to
    several times the foreground's own. About the order of the guard's acts, not its readings:
    the probe reads a pinned value, so a busy machine cannot stop the drain or the idle probes."""
    settings.RETENTION = {**settings.RETENTION, "GUARD_PINNED_PROBE_MS": 1.0}
    run, _ = trigger_run(committed_policy, tick=NOW)
    GuardSample.objects.all().delete()
    seen: list = []
    real_plan = planner.plan

    def plan(*args, **kwargs):
        seen.append(
            [s.tables.get(TABLE, {}).get("idle_probes_ms") for s in GuardSample.objects.all()]
        )
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(planner, "plan", plan)
    stats = worker.drain(run.pk, budget_s=60)
    assert stats["stopped"] == "no work left", stats
    assert seen, "the lease planned"
    assert [len(p or []) for p in seen[0]] == [guard.IDLE_PROBES]
