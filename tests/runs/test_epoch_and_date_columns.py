"""Timestamps that are not timestamps: epoch numbers (``timestamp_unit``) and ``date`` columns.

An epoch column is compared raw against a bound computed once from the run's cutoff, so its
own btree index serves the comparison; a ``date`` row goes only when its whole day, in the
policy's zone, is past the cutoff. Each case runs the real engine on PostgreSQL and checks
exactly which rows went."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction
from django.urls import reverse

from retention import predicate as P
from retention.preview import preview
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


def ms(instant: datetime) -> int:
    return (instant - EPOCH) // timedelta(milliseconds=1)


def _drain(policy, tick: datetime) -> Run:
    run, _ = trigger_run(policy, tick=tick)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


@pytest.fixture
def epoch_table(db, settings):
    """``public.rr_epoch``: a row every two minutes for eleven days before NOW, its time in
    ``created_ms`` (bigint milliseconds since the epoch, with an index), tenants 1-3; and two
    rows a millisecond either side of the cutoff of a 10-day policy ticking at NOW."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    cutoff = NOW - timedelta(days=10)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_epoch, public.rr_epoch_shadow")
        cur.execute(
            "CREATE TABLE public.rr_epoch (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            " created_ms bigint NOT NULL, status text)"
        )
        cur.execute(
            "INSERT INTO public.rr_epoch SELECT g, 1 + g %% 3, %s - g * 120000, 'closed'"
            " FROM generate_series(1, 11 * 720) AS g",
            [ms(NOW)],
        )
        cur.execute(
            "INSERT INTO public.rr_epoch VALUES (100001, 1, %s, 'closed'), (100002, 1, %s, 'closed')",
            [ms(cutoff) - 1, ms(cutoff)],
        )
        cur.execute("CREATE INDEX rr_epoch_created ON public.rr_epoch (created_ms)")
        cur.execute("CREATE INDEX ON public.rr_epoch (tenant_id, id)")
        cur.execute("CREATE TABLE public.rr_epoch_shadow AS SELECT * FROM public.rr_epoch")
        cur.execute("ANALYZE public.rr_epoch")
    return cutoff


def epoch_spec(**overrides) -> dict:
    return events_spec(
        slug="epoch", table="rr_epoch", timestamp="created_ms", timestamp_unit="ms",
        retention="10 days", keep=[], chunk_size=500, **overrides,
    )  # fmt: skip


def test_an_epoch_column_drains_exactly_the_rows_before_the_cutoff_to_the_millisecond(
    epoch_table, make_user
):
    cutoff = epoch_table
    policy = approved_policy(make_user, **epoch_spec())
    # the preview taken at submission (its own cutoff, from the clock) counts the same rows
    taken = policy.approved_version.preview
    before = ms(datetime.fromisoformat(taken["cutoff"]))
    assert taken["eligible"] == count("public.rr_epoch", "created_ms < %s", [before]) > 0
    run = _drain(policy, NOW)

    assert run.cutoff == cutoff
    assert count("public.rr_epoch", "created_ms < %s", [ms(cutoff)]) == 0
    gone = count("public.rr_epoch_shadow") - count("public.rr_epoch")
    assert gone == count("public.rr_epoch_shadow", "created_ms < %s", [ms(cutoff)]) > 0
    assert count("public.rr_epoch", "id = 100001") == 0  # a millisecond before the cutoff
    assert count("public.rr_epoch", "id = 100002") == 1  # the cutoff itself stays
    assert check_run(run, shadow=("public", "rr_epoch_shadow")) == []
    # the audit trail names the cutoff as an instant, never the raw number
    assert {r.cutoff for r in AuditRecord.objects.filter(run=run)} == {cutoff}


def test_an_epoch_columns_bound_is_one_number_its_own_btree_index_serves(epoch_table, make_user):
    cutoff = epoch_table
    spec = approved_policy(make_user, **epoch_spec()).approved_version.parsed
    older = P.older_than(spec, cutoff)
    assert older.params == [ms(cutoff)]  # computed once, in the column's unit
    query = P.count_where(spec, older)
    with transaction.atomic(), connection.cursor() as cur:
        # with sequential scans priced out, the plan shows whether an index path exists at all
        # (a comparison on an expression of the column would have none)
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + query.sql.as_string(cur.connection), query.params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "rr_epoch_created" in plan, plan
    assert "Index Cond: (created_ms < '" in plan, plan


@pytest.mark.parametrize(
    ("column", "unit", "cutoff", "bound"),
    [
        ("bigint", "s", datetime(2026, 11, 20, 12, 0, 0, 500_000, tzinfo=UTC), 1795176001),
        ("bigint", "ms", datetime(2026, 11, 20, 12, 0, 0, 500_001, tzinfo=UTC), 1795176000501),
        ("bigint", "us", datetime(2026, 11, 20, 12, 0, 0, 500_001, tzinfo=UTC), 1795176000500001),
        ("numeric", "s", datetime(2026, 11, 20, 12, 0, 0, 500_000, tzinfo=UTC), "1795176000.5"),
        ("integer", "s", datetime(2026, 11, 20, 12, 0, tzinfo=UTC), 1795176000),
        (
            "double precision",
            "s",
            datetime(2026, 11, 20, 12, 0, 0, 500_001, tzinfo=UTC),
            "1795176000.5000012",
        ),
        (
            "double precision",
            "ms",
            datetime(2026, 11, 20, 12, 0, 0, 500_001, tzinfo=UTC),
            "1795176000500.0012",
        ),
        ("real", "s", datetime(2026, 11, 20, 12, 0, tzinfo=UTC), "1795176000.0"),
    ],
)
def test_the_bound_says_exactly_which_stored_numbers_are_before_the_cutoff(
    db, make_user, column, unit, cutoff, bound
):
    """An integer column's bound is the least whole unit not before the cutoff (a row at
    1795176000 s is before 12:00:00.5, one at 1795176001 is not); a numeric column's is the
    cutoff exactly."""
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_epoch_units")
        cur.execute(f"CREATE TABLE public.rr_epoch_units (id bigint PRIMARY KEY, at {column})")
    fields = events_spec(
        slug="units", table="rr_epoch_units", timestamp="at", timestamp_unit=unit,
        tenant=None, keep=[], chunking="auto",
    )  # fmt: skip
    spec = approved_policy(make_user, **fields).approved_version.parsed
    (value,) = P.older_than(spec, cutoff).params
    assert str(value) == str(bound)


@pytest.fixture
def visits(db, settings):
    """``public.rr_visits``: one row per day from 2026-11-20 to 2026-12-01 (a ``date``)."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_visits, public.rr_visits_shadow")
        cur.execute(
            "CREATE TABLE public.rr_visits (id bigint PRIMARY KEY, visited_on date NOT NULL)"
        )
        cur.execute(
            "INSERT INTO public.rr_visits SELECT row_number() OVER (ORDER BY d), d::date"
            " FROM generate_series('2026-11-20'::date, '2026-12-01'::date, '1 day') AS d"
        )
        cur.execute("CREATE INDEX ON public.rr_visits (visited_on)")
        cur.execute("CREATE TABLE public.rr_visits_shadow AS SELECT * FROM public.rr_visits")
        cur.execute("ANALYZE public.rr_visits")


def _remaining_days() -> list[date]:
    with connection.cursor() as cur:
        cur.execute("SELECT visited_on FROM public.rr_visits ORDER BY 1")
        return [row[0] for row in cur.fetchall()]


def test_a_date_row_goes_only_when_its_whole_day_is_past_the_cutoff(visits, make_user):
    fields = events_spec(
        slug="visits", table="rr_visits", timestamp="visited_on", tenant=None, keep=[],
        retention="3 days", timezone="Europe/Berlin", chunking="auto",
    )  # fmt: skip
    policy = approved_policy(make_user, **fields)
    tick = datetime(2026, 12, 1, 3, 0, tzinfo=BERLIN)
    spec = policy.approved_version.parsed
    assert spec.cutoff_for(tick) == datetime(2026, 11, 28, 3, 0, tzinfo=BERLIN)
    # the preview counts the same rows the run deletes: the 27th's day ended before the
    # cutoff, the 28th's (the cutoff's own day) did not
    ahead = preview(spec, policy_id=policy.pk, now=tick + timedelta(minutes=1))
    assert ahead["eligible"] == 8

    run = _drain(policy, tick.astimezone(UTC))

    assert _remaining_days()[0] == date(2026, 11, 28)  # the cutoff's own day stays
    assert date(2026, 11, 27) not in _remaining_days()  # the day before goes
    assert count("public.rr_visits") == 4
    assert check_run(run, shadow=("public", "rr_visits_shadow")) == []


@pytest.fixture
def epoch_parts(transactional_db, settings):
    """``public.rr_eparts``: range-partitioned by ``created_ms`` (bigint milliseconds), one
    partition per month of 2026; 4,000 rows from 2026-01-01 to NOW; shadow copy beside it."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    months = [datetime(2026, m, 1, tzinfo=UTC) for m in range(1, 13)] + [
        datetime(2027, 1, 1, tzinfo=UTC)
    ]
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_eparts, public.rr_eparts_shadow CASCADE")
        cur.execute(
            "CREATE TABLE public.rr_eparts (id bigint NOT NULL, tenant_id int NOT NULL,"
            " created_ms bigint NOT NULL, status text) PARTITION BY RANGE (created_ms)"
        )
        for start, end in zip(months, months[1:], strict=False):
            cur.execute(
                f"CREATE TABLE public.rr_eparts_{start:%Y_%m} PARTITION OF public.rr_eparts"
                f" FOR VALUES FROM ({ms(start)}) TO ({ms(end)})"
            )
        cur.execute(
            "INSERT INTO public.rr_eparts SELECT g, 1 + g %% 4,"
            " %s + (%s - %s) * (g - 1) / 4000, 'closed' FROM generate_series(1, 4000) AS g",
            [ms(months[0]), ms(NOW), ms(months[0])],
        )
        cur.execute("CREATE INDEX ON public.rr_eparts (tenant_id, id)")
        cur.execute("CREATE TABLE public.rr_eparts_shadow AS SELECT * FROM public.rr_eparts")
        cur.execute("ANALYZE public.rr_eparts")
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_eparts, public.rr_eparts_shadow CASCADE")
        for start in months[:-1]:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_eparts_{start:%Y_%m}")


def test_partitions_of_an_epoch_column_wholly_past_the_cutoff_are_dropped_and_shown_as_dates(
    epoch_parts, make_user, client
):
    fields = events_spec(
        slug="eparts", table="rr_eparts", timestamp="created_ms", timestamp_unit="ms",
        retention="120 days", keep=[],
    )  # fmt: skip
    policy = approved_policy(make_user, **fields)
    spec = policy.approved_version.parsed
    ahead = preview(spec, policy_id=policy.pk, now=NOW)
    by_name = {p["partition"]: p for p in ahead["partitions"]}
    january = by_name["public.rr_eparts_2026_01"]
    assert january["bounds"] == (
        "FOR VALUES FROM (2026-01-01 00:00:00+00:00) TO (2026-02-01 00:00:00+00:00)"
    )
    expired = [f"public.rr_eparts_2026_{m:02d}" for m in range(1, 8)]  # cutoff 2026-08-02
    assert [p["partition"] for p in ahead["partitions"] if p["action"] == "drop"] == expired

    run = _drain(policy, NOW)

    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'public.rr_eparts'::regclass ORDER BY 1"
        )
        left = [row[0] for row in cur.fetchall()]
    assert left == [f"rr_eparts_2026_{m:02d}" for m in range(8, 13)]
    assert count("public.rr_eparts", "created_ms < %s", [ms(run.cutoff)]) == 0
    dropped = AuditRecord.objects.filter(run=run, outcome="dropped").count()
    assert dropped == len(expired)
    assert check_run(run, shadow=("public", "rr_eparts_shadow")) == []
    client.force_login(make_user("vera", "viewer"))
    page = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert "FROM (2026-01-01 00:00:00+00:00) TO (2026-02-01 00:00:00+00:00)" in page
    assert str(ms(datetime(2026, 2, 1, tzinfo=UTC))) not in page


def test_an_expiry_timestamp_with_zero_retention_deletes_what_expired_before_the_tick(
    db, make_user, settings
):
    """``expire_date`` is when a session expires: with ``timestamp_is_expiry`` a retention of
    "0 days" deletes every row expired before the tick, none expiring at it or later; a
    boolean keep value keeps the pinned ones."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_sessions")
        cur.execute(
            "CREATE TABLE public.rr_sessions (id bigint PRIMARY KEY, expire_date timestamptz"
            " NOT NULL, pinned boolean NOT NULL)"
        )
        cur.execute(
            "INSERT INTO public.rr_sessions SELECT g, %s::timestamptz + (g - 50) * interval"
            " '1 minute', g %% 10 = 0 FROM generate_series(1, 100) AS g",
            [NOW],
        )
    fields = events_spec(
        slug="sessions", table="rr_sessions", timestamp="expire_date", tenant=None,
        retention="0 days", timestamp_is_expiry=True, chunking="auto",
        keep=[{"column": "pinned", "op": "=", "value": True}],
    )  # fmt: skip
    run = _drain(approved_policy(make_user, **fields), NOW)
    assert run.cutoff == NOW
    # rows 1..49 expired before the tick; the pinned ones among them (10..40) stay
    assert count("public.rr_sessions", "expire_date < %s", [NOW]) == 4
    assert count("public.rr_sessions", "expire_date < %s AND NOT pinned", [NOW]) == 0
    assert count("public.rr_sessions", "expire_date >= %s", [NOW]) == 51


@pytest.mark.parametrize(("column", "unit", "per_second"), [
    ("double precision", "s", 1), ("double precision", "ms", 1000), ("real", "s", 1),
])  # fmt: skip
def test_a_floating_point_epoch_column_drains_exactly_the_rows_before_the_cutoff(
    db, settings, make_user, column, unit, per_second
):
    """A recorder's ``last_updated_ts`` (``double precision`` seconds since the epoch, with a
    fraction): rows a microsecond before the cutoff go, the cutoff itself and a microsecond
    after it stay — the bound is the least double not below the cutoff's exact value."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    cutoff = NOW - timedelta(days=10)
    c = (cutoff - EPOCH) / timedelta(seconds=1) * per_second
    tiny = 1e-6 * per_second if column == "double precision" else 256.0
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_floats, public.rr_floats_shadow")
        cur.execute(
            f"CREATE TABLE public.rr_floats (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            f" at {column} NOT NULL, status text)"
        )
        cur.execute(
            "INSERT INTO public.rr_floats SELECT g, 1 + g %% 3, %s - g * 600.0 * %s, 'closed'"
            " FROM generate_series(1, 3000) AS g",
            [(NOW - EPOCH) / timedelta(seconds=1) * per_second, per_second],
        )
        cur.execute(
            "INSERT INTO public.rr_floats VALUES (100001, 1, %s, 'closed'),"
            " (100002, 1, %s, 'closed'), (100003, 1, %s, 'closed')",
            [c - tiny, c, c + tiny],
        )
        cur.execute("CREATE INDEX ON public.rr_floats (at)")
        cur.execute("CREATE INDEX ON public.rr_floats (tenant_id, id)")
        cur.execute("CREATE TABLE public.rr_floats_shadow AS SELECT * FROM public.rr_floats")
    policy = approved_policy(
        make_user, **events_spec(slug="floats", table="rr_floats", timestamp="at",
                                 timestamp_unit=unit, retention="10 days", keep=[]),
    )  # fmt: skip
    run = _drain(policy, NOW)
    assert run.cutoff == cutoff
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_floats WHERE id > 100000 ORDER BY id")
        left = [row[0] for row in cur.fetchall()]
    if column == "real":  # the cutoff's value as a real may lie either side of it
        assert 100001 not in left and 100003 in left
    else:
        assert left == [100002, 100003]
    assert check_run(run, shadow=("public", "rr_floats_shadow")) == []
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_floats, public.rr_floats_shadow")
