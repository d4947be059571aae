"""Reconciler passes, in process: per-policy isolation, bounded statements, schedule repair."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.models import Schedule

from core import timeouts
from retention.schedule_math import next_tick
from runs.actions import _eligible_count, trigger_run
from runs.engine import schedules
from runs.engine.reconciler import reconcile
from runs.models import Run
from tests.liveness.conftest import drop_tables, policy_on
from tests.runs.processes import pg_connect

pytestmark = pytest.mark.django_db(transaction=True)


def show(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SHOW {name}")
        return cur.fetchone()[0]


def test_the_eligible_counts_timeout_does_not_outlive_its_savepoint(make_user):
    policy = policy_on(make_user, "alpha", "rr_alpha")
    run, _ = trigger_run(policy, tick=timezone.now())
    try:
        with transaction.atomic():
            timeouts.set_local(5000)
            assert _eligible_count(run, run.policy_version.parsed, 10) is not None
            # a later statement of the same transaction (a verification) keeps its 5 s bound
            assert show("statement_timeout") == "5s"
    finally:
        drop_tables("rr_alpha")


def test_a_policy_whose_table_is_locked_does_not_hold_back_the_others(make_user):
    policy_on(make_user, "alpha", "rr_alpha", approved_ago=timedelta(days=3))
    beta = policy_on(make_user, "beta", "rr_beta", approved_ago=timedelta(days=3))
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_alpha IN ACCESS EXCLUSIVE MODE")
    try:
        report = reconcile()
        assert Run.objects.filter(policy=beta, source="catch-up").exists(), str(report)
    finally:
        blocker.rollback()
        blocker.close()
        drop_tables("rr_alpha", "rr_beta")


def armed(policy) -> Schedule | None:
    return Schedule.objects.filter(name=schedules.schedule_name(policy)).first()


@pytest.mark.parametrize(
    "damage",
    ["fired but not re-armed", "next run in the past", "missing"],
)
def test_the_reconciler_repairs_a_dead_schedule(make_user, damage):
    policy = policy_on(make_user, "alpha", "rr_alpha", catch_up="none")
    now = timezone.now()
    if damage == "fired but not re-armed":  # a trigger that failed before arm()
        Schedule.objects.filter(name=schedules.schedule_name(policy)).update(
            repeats=0, next_run=now - timedelta(hours=5)
        )
    elif damage == "next run in the past":  # a lost trigger message
        Schedule.objects.filter(name=schedules.schedule_name(policy)).update(
            next_run=now - timedelta(days=1)
        )
    else:
        Schedule.objects.filter(name=schedules.schedule_name(policy)).delete()
    try:
        report = reconcile(now=now)
        schedule = armed(policy)
        assert schedule is not None and schedule.repeats == 1, report
        assert schedule.next_run == next_tick(policy, now)
        assert report["rearmed"] == ["alpha"]
        assert reconcile(now=now)["rearmed"] == []  # a healthy schedule is left alone
    finally:
        drop_tables("rr_alpha")


def test_a_due_schedule_is_left_for_the_scheduler(make_user):
    policy = policy_on(make_user, "alpha", "rr_alpha")
    due = armed(policy).next_run
    reconcile(now=due + timedelta(seconds=40))  # django-q2 polls every ~30 s
    try:
        assert armed(policy).next_run == due
    finally:
        drop_tables("rr_alpha")


def test_a_cron_change_rearms_to_the_true_next_tick(make_user):
    """daily 03:00 → hourly: tomorrow 03:00 fits the new cron, but it is not the next tick."""
    from tests.factories import approved_policy, events_spec

    policy = policy_on(make_user, "alpha", "rr_alpha", schedule="0 3 * * *")
    try:
        approved_policy(
            make_user, **events_spec(slug="alpha", table="rr_alpha", schedule="0 * * * *")
        )
        policy.refresh_from_db()
        now = timezone.now()
        expected = next_tick(policy, now)
        assert armed(policy).next_run == expected
        assert expected - now <= timedelta(hours=1)
    finally:
        drop_tables("rr_alpha")


def test_one_locked_table_defers_no_other_policy_to_the_next_pass(make_user, monkeypatch):
    """The locked policy comes first and its run's verification waits on the lock: the other
    policies are still reconciled in the same pass (before, a pass started a policy only
    while four statement timeouts still fitted, and the next two were deferred)."""
    from runs.engine import planner, reconciler
    from runs.models import Chunk

    # chunking "auto": a new run samples the table for its geometry (and waits on the lock)
    locked = policy_on(
        make_user, "alpha", "rr_alpha", approved_ago=timedelta(days=3), chunking="auto"
    )
    others = [
        policy_on(make_user, slug, f"rr_{slug}", approved_ago=timedelta(days=3))
        for slug in ("beta", "gamma")
    ]
    run, _ = trigger_run(locked, tick=timezone.now() - timedelta(days=4))
    while not run.planner_done:
        planner.plan(run, window=1000)
    Chunk.objects.filter(run=run).update(state=Chunk.State.DONE)  # every chunk committed
    # the locked policy first, then the others, whatever the shuffle says
    monkeypatch.setattr(
        reconciler.random, "shuffle", lambda items: items.sort(key=lambda p: p.slug)
    )
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_alpha IN ACCESS EXCLUSIVE MODE")
    try:
        report = reconcile()
    finally:
        blocker.rollback()
        blocker.close()
        drop_tables("rr_alpha", "rr_beta", "rr_gamma")
    assert report["deferred"] == [], report
    for policy in others:
        assert Run.objects.filter(policy=policy, source="catch-up").exists(), report
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE
    assert run.state_reason.startswith("verification postponed"), run.state_reason


def test_a_catch_up_records_the_ticks_lost_before_a_later_tick_that_ran_on_time(make_user):
    """The cluster was down across three ticks; when it came back, the next tick fired on time
    before the reconciler's pass: the catch-up run for the newest missed tick records the two
    before it (before, the later run hid them: neither run nor recorded)."""
    from retention.schedule_math import latest_tick

    policy = policy_on(
        make_user, "alpha", "rr_alpha", approved_ago=timedelta(days=1),
        schedule="*/30 * * * *", catch_up="latest",
    )  # fmt: skip
    try:
        now = timezone.now()
        on_time = latest_tick(policy, now)  # fired on time, just now
        missed = [on_time - timedelta(minutes=30 * n) for n in (1, 2, 3)]  # newest first
        before = on_time - timedelta(minutes=120)
        for tick in (before, on_time):
            trigger_run(policy, tick=tick)
        reconcile(now=on_time + timedelta(minutes=1))  # before the grace: its pass sees "missed[0]"
        caught = Run.objects.get(policy=policy, source="catch-up")
        assert caught.tick == missed[0]
        assert caught.skipped_ticks == [t.isoformat() for t in reversed(missed[1:])]
    finally:
        drop_tables("rr_alpha")


# a policy's transaction and lock (4), its approved version and schedule, the catch-up's check,
# each step's read of its runs and partitions, the active run's leases and the table's detaches
PER_POLICY_QUERIES = 20


def test_a_pass_costs_a_fixed_number_of_queries_per_policy_whatever_its_runs(make_user, settings):
    """A pass's statements (counted on the real connection) grow by the same few per policy
    and not at all with a policy's runs: three times the ended runs cost nothing more, and
    each further policy with an active and a waiting run costs what the first one did."""
    from django.test.utils import CaptureQueriesContext

    from retention.schedule_math import latest_tick
    from runs.engine.reconciler import CATCH_UP_GRACE, PassBudget

    # no lease goes stale and no step waits for the next pass, however long the setup takes
    settings.RETENTION = {**settings.RETENTION, "LEASE_STALE_S": 10**6}
    now = timezone.now()

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            report = reconcile(now=now, budget=PassBudget(time.monotonic() + 10**6, 0))
        assert not (report["failed"] or report["busy"] or report["deferred"]), report
        return len(ctx.captured_queries)

    def steady() -> int:
        queries()  # what the state asks of a pass (a fold, a reason) is done once
        first, second = queries(), queries()
        assert first == second
        return first

    def with_runs(slug: str, ended: int):
        """A policy with an active run, a waiting one (the newest tick: nothing to catch up)
        and ``ended`` older runs folded into the waiting one."""
        policy = policy_on(
            make_user, slug, f"rr_{slug}", rows=50, approved_ago=timedelta(days=1),
            schedule="*/30 * * * *", catch_up="latest",
        )  # fmt: skip
        newest = latest_tick(policy, now - CATCH_UP_GRACE)
        for n in (1, 0):
            trigger_run(policy, tick=newest - timedelta(minutes=30 * n))
        add_ended(policy, ended)
        return policy

    def add_ended(policy, n: int) -> None:
        older = Run.objects.filter(policy=policy).order_by("tick").values_list("tick", flat=True)
        first = older.first()
        for i in range(1, n + 1):
            trigger_run(policy, tick=first - timedelta(minutes=30 * i))

    slugs = ["alpha", "beta", "gamma"]
    try:
        none = steady()
        alpha = with_runs("alpha", ended=2)
        one = steady()
        assert Run.objects.filter(policy=alpha, state=Run.State.ACTIVE).count() == 1
        assert Run.objects.filter(policy=alpha, state=Run.State.WAITING).count() == 1
        add_ended(alpha, 4)  # three times its ended runs
        assert Run.objects.filter(policy=alpha, state=Run.State.SKIPPED).count() == 6
        assert steady() == one
        for slug in slugs[1:]:
            with_runs(slug, ended=2)
        three = steady()
        per_policy = one - none
        assert three - none == 3 * per_policy, (none, one, three)
        assert per_policy <= PER_POLICY_QUERIES, per_policy
    finally:
        drop_tables(*(f"rr_{s}" for s in slugs))
