"""Planning: chunks cover disjoint intervals, the planner keeps a bounded window ahead, and on
tables the demo does not look like a permanent error while planning puts the
run in "needs attention" with a dead letter (it is not retried for ever as if the connection
were lost); the ledger holds any tenant value the target column can hold; keys at the top of
their type's range are planned and deleted."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import check_run
from runs.models import Chunk, DeadLetter, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count


@pytest.fixture(autouse=True)
def guard_off(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}


def make_table(name: str, key_type: str, tenant_type: str, rows: list[tuple]) -> None:
    """``public.<name>`` (id, tenant, occurred_at) and its shadow copy."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}, public.{name}_shadow")
        cur.execute(
            f"CREATE TABLE public.{name} (id {key_type} PRIMARY KEY, tenant {tenant_type} NOT NULL,"
            " occurred_at timestamptz NOT NULL)"
        )
        cur.executemany(f"INSERT INTO public.{name} VALUES (%s, %s, %s)", rows)
        cur.execute(f"CREATE INDEX ON public.{name} (tenant, id)")
        cur.execute(f"CREATE TABLE public.{name}_shadow AS SELECT * FROM public.{name}")
        cur.execute(f"ANALYZE public.{name}")


def policy_on(make_user, name: str, **overrides):
    return approved_policy(
        make_user,
        **events_spec(
            slug=name.replace("_", "-"), table=name, tenant="tenant", keep=[], **overrides
        ),
    )


def drain(run: Run) -> dict:
    return worker.drain(run.pk, budget_s=20)


def test_a_column_renamed_after_the_trigger_puts_the_run_in_attention_with_a_dead_letter(
    events_policy, make_user
):
    run, _ = trigger_run(events_policy, tick=NOW)
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_events RENAME COLUMN occurred_at TO happened_at")
    stats = drain(run)
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state_reason
    assert "planning failed" in run.state_reason and "undefined column" in run.state_reason
    assert stats["continue"] is False
    letter = DeadLetter.objects.get(run=run)
    assert (letter.error_class, letter.sqlstate, letter.chunk_id) == ("permanent", "42703", None)
    for key in ("policy", "policy_version", "run", "table", "cutoff", "stage", "pass"):
        assert key in letter.context, key
    assert not Chunk.objects.filter(run=run).exists()
    # the cause fixed, replaying the dead letter plans and drains the same run
    from runs.actions import replay_dead_letter

    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_events RENAME COLUMN happened_at TO occurred_at")
    replay_dead_letter(letter, actor=make_user("olga", "oncall"), reason="column restored")
    drain(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


def test_a_tenant_longer_than_any_ledger_limit_is_planned_and_deleted(make_user, db):
    long_tenant = "tenant-" + "x" * 500
    old = NOW.replace(year=2025)
    make_table(
        "rr_wide",
        "bigint",
        "text",
        [(i, long_tenant if i % 2 else "short", old) for i in range(1, 41)],
    )
    run, _ = trigger_run(policy_on(make_user, "rr_wide"), tick=NOW)
    drain(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_wide") == 0
    assert Chunk.objects.filter(run=run, tenant=long_tenant, state=Chunk.State.DONE).exists()
    assert check_run(run, shadow=("public", "rr_wide_shadow")) == []


@pytest.mark.parametrize(
    ("key_type", "top"),
    [("smallint", 2**15 - 1), ("integer", 2**31 - 1), ("bigint", 2**63 - 1)],
)
def test_keys_at_the_top_of_their_type_are_planned_and_deleted(make_user, db, key_type, top):
    old, new = NOW.replace(year=2025), NOW
    rows = [(top - i, "a", old) for i in range(30)] + [(top - 30, "a", new)]
    make_table("rr_top", key_type, "text", rows)
    run, _ = trigger_run(policy_on(make_user, "rr_top", chunk_size=10), tick=NOW)
    drain(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_top") == 1  # the one newer row
    assert check_run(run, shadow=("public", "rr_top_shadow")) == []


@pytest.mark.django_db(transaction=True)  # the blocker must see the table
def test_a_transient_planning_error_backs_off_and_the_run_goes_on(events_policy, settings):
    from tests.runs.processes import pg_connect

    # a 12 s task timeout bounds each planner statement to one second
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 12}
    run, _ = trigger_run(events_policy, tick=NOW)
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN ACCESS EXCLUSIVE MODE")
    try:
        stats = worker.drain(run.pk, budget_s=3)
    finally:
        blocker.rollback()
        blocker.close()
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE, run.state_reason
    assert stats["failed"] >= 1 and stats["continue"] is True
    assert not DeadLetter.objects.filter(run=run).exists()
    drain(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_chunks_cover_disjoint_intervals_per_tenant(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    by_tenant: dict[str, list[tuple[int, int]]] = {}
    for c in Chunk.objects.filter(run=run):
        by_tenant.setdefault(c.tenant, []).append((c.key_from, c.key_to))
    for intervals in by_tenant.values():
        intervals.sort()
        for (_a_from, a_to), (b_from, _b_to) in zip(intervals, intervals[1:], strict=False):
            assert a_to <= b_from


def test_the_planner_keeps_a_bounded_window_of_pending_chunks(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=3)
    assert Chunk.objects.filter(run=run, state=Chunk.State.PENDING).count() == 3
    assert not run.planner_done
