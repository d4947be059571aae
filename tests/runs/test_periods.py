"""Per-tenant periods (``[[override]]``) and periods per kind of row (``[[class]]``): a run
deletes each row by the period that applies to it, in the DELETE's own predicate, and leaves
exactly what a snapshot of the table taken before says each period keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from retention import predicate as P
from retention.preview import preview
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.exports import manifest_header
from runs.evidence.invariants import ROW, Oracle, check_run
from runs.models import Run
from tests.factories import approved_policy

pytestmark = pytest.mark.usefixtures("no_guard")

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def _sql(text: str, params=None) -> list:
    with connection.cursor() as cur:
        cur.execute(text, params or [])
        return cur.fetchall() if cur.description else []


def _spec(**fields) -> dict:
    spec = dict(
        slug="periods",
        table="public.rr_periods",
        key="id",
        timestamp="occurred_at",
        retention="20 days",
        schedule="0 12 * * *",  # the latest tick of NOW is NOW: the preview's cutoff is the run's
        timezone="UTC",
        chunk_size=100,
        chunking="key",
    )
    spec.update(fields)
    return spec


def _drain(policy) -> Run:
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def _tenant_table(tenant_type: str = "text") -> None:
    """``rr_periods``: one row a day for 400 days for each of tenants a, b, c, d (snapshot
    ``rr_periods_before``)."""
    _sql("DROP TABLE IF EXISTS public.rr_periods, public.rr_periods_before")
    _sql(
        f"CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, tenant {tenant_type} NOT NULL,"
        " occurred_at timestamptz NOT NULL, state text)"
    )
    _sql(
        "INSERT INTO public.rr_periods SELECT d * 4 + n, (ARRAY['a','b','c','d'])[n + 1],"
        " %s::timestamptz - make_interval(days => d) - interval '1 hour', 'x'"
        " FROM generate_series(0, 399) AS d, generate_series(0, 3) AS n",
        [NOW],
    )
    _sql("CREATE INDEX ON public.rr_periods (tenant, id)")
    _sql("CREATE TABLE public.rr_periods_before AS SELECT * FROM public.rr_periods")
    _sql("ANALYZE public.rr_periods")


def _remaining(where_by: str) -> dict:
    return dict(_sql(f"SELECT {where_by}, count(*) FROM public.rr_periods GROUP BY 1"))


@pytest.mark.parametrize("chunking", ["key", "tenant"])
def test_three_tenants_drain_exactly_by_their_own_periods(db, make_user, chunking):
    """Default 20 days; b overridden to 200 days, c kept forever, d shortened to 5 days: each
    tenant's rows left are exactly the snapshot's rows younger than its own cutoff — in chunks
    across tenants (each row looked up) and per tenant (the chunk's tenant decided once)."""
    _tenant_table()
    policy = approved_policy(
        make_user,
        **_spec(
            tenant="tenant",
            chunking=chunking,
            override=[
                {"tenant": "b", "retention": "200 days"},
                {"tenant": ["c"], "retention": "forever"},
                {"tenant": "d", "retention": "5 days"},
            ],
        ),
    )
    # the preview counts, per period, what the run then deletes
    shown = preview(policy.approved_version.parsed, policy_id=policy.pk, now=NOW)
    assert shown["cutoff"] == (NOW - 20 * DAY).isoformat()
    assert shown["eligible"] == 380 + 200 + 0 + 395
    assert {t["tenant"]: t["eligible"] for t in shown["tenants"]} == {
        "a": 380,
        "b": 200,
        "c": 0,
        "d": 395,
    }
    assert [
        (p["applies_to"], p["retention"], p["cutoff"], p["eligible"]) for p in shown["periods"]
    ] == [
        ("default", "20 days", (NOW - 20 * DAY).isoformat(), 380),
        ("override[0]", "200 days", (NOW - 200 * DAY).isoformat(), 200),
        ("override[1]", "forever", None, 0),
        ("override[2]", "5 days", (NOW - 5 * DAY).isoformat(), 395),
    ]
    run = _drain(policy)
    assert run.chunking == chunking
    cutoffs = {"a": NOW - 20 * DAY, "b": NOW - 200 * DAY, "c": None, "d": NOW - 5 * DAY}
    expected = {}
    for tenant, cutoff in cutoffs.items():
        rows = _sql(
            "SELECT id FROM public.rr_periods_before WHERE tenant = %s"
            " AND (%s::timestamptz IS NULL OR occurred_at >= %s) ORDER BY id",
            [tenant, cutoff, cutoff],
        )
        expected[tenant] = [r[0] for r in rows]
    left = {
        t: [
            r[0]
            for r in _sql("SELECT id FROM public.rr_periods WHERE tenant = %s ORDER BY id", [t])
        ]
        for t in cutoffs
    }
    assert left == expected
    assert {t: len(v) for t, v in left.items()} == {"a": 20, "b": 200, "c": 400, "d": 5}
    assert run.verification["remaining"] == 0
    # the invariant checker, computing each period's cutoff from the tick on its own, agrees
    assert check_run(run, shadow=("public", "rr_periods_before")) == []
    # …by each row's own period: by the default cutoff alone, b's and c's rows left are old
    oracle = Oracle(run)
    for cond, expected in ((oracle.old(), 0), (oracle.old_at(run.cutoff), 180 + 380)):
        query = P.sql.SQL("SELECT count(*) FROM public.rr_periods AS {} WHERE ({}) IS TRUE")
        assert _sql(query.format(ROW, cond[0]).as_string(connection.connection), cond[1]) == [
            (expected,)
        ]
    # the evidence: each period's cutoff in the manifest, and on the run page
    periods = manifest_header(run)["periods"]
    assert [(p["applies_to"], p.get("tenants"), p["cutoff"]) for p in periods] == [
        ("default", None, (NOW - 20 * DAY).isoformat()),
        ("override[0]", ["b"], (NOW - 200 * DAY).isoformat()),
        ("override[1]", ["c"], None),
        ("override[2]", ["d"], (NOW - 5 * DAY).isoformat()),
    ]
    client = Client()
    client.force_login(make_user("vic", "viewer"))
    html = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert "tenant b: 200 days (older than 2026-05-14 12:00:00)" in html
    assert "tenant c: forever (kept)" in html
    deleted = sum(400 - len(v) for v in left.values())
    assert deleted == 380 + 200 + 0 + 395


def test_a_job_history_table_drains_exactly_by_class(db, make_user):
    """completed after 3 days, failed after a year, the rest (running) by the default 30 days."""
    _sql("DROP TABLE IF EXISTS public.rr_periods, public.rr_periods_before")
    _sql(
        "CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL,"
        " state text)"
    )
    _sql(
        "INSERT INTO public.rr_periods SELECT d * 4 + n,"
        " %s::timestamptz - make_interval(days => d) - interval '1 hour',"
        " (ARRAY['completed','failed','running', NULL])[n + 1]"
        " FROM generate_series(0, 499) AS d, generate_series(0, 3) AS n",
        [NOW],
    )
    _sql("CREATE TABLE public.rr_periods_before AS SELECT * FROM public.rr_periods")
    policy = approved_policy(
        make_user,
        **_spec(
            retention="30 days",
            **{
                "class": [
                    {"column": "state", "value": "completed", "retention": "3 days"},
                    {"column": "state", "value": "failed", "retention": "1 year"},
                ]
            },
        ),
    )
    run = _drain(policy)
    assert check_run(run, shadow=("public", "rr_periods_before")) == []
    expected = dict(
        _sql(
            "SELECT coalesce(state, 'null'), count(*) FROM public.rr_periods_before WHERE"
            " CASE state WHEN 'completed' THEN occurred_at >= %s WHEN 'failed' THEN"
            " occurred_at >= %s ELSE occurred_at >= %s END GROUP BY 1",
            [NOW - 3 * DAY, datetime(2025, 11, 30, 12, 0, tzinfo=UTC), NOW - 30 * DAY],
        )
    )
    assert _remaining("coalesce(state, 'null')") == expected
    assert expected == {"completed": 3, "failed": 365, "running": 30, "null": 30}
    gone = _sql(
        "SELECT b.id FROM public.rr_periods_before b LEFT JOIN public.rr_periods r USING (id)"
        " WHERE r.id IS NULL EXCEPT SELECT id FROM public.rr_periods_before WHERE"
        " CASE state WHEN 'completed' THEN occurred_at < %s WHEN 'failed' THEN"
        " occurred_at < %s ELSE occurred_at < %s END",
        [NOW - 3 * DAY, datetime(2025, 11, 30, 12, 0, tzinfo=UTC), NOW - 30 * DAY],
    )
    assert gone == []


@pytest.mark.parametrize(
    ("tenant_type", "rows", "written", "others"),
    [
        ("citext", ["Acme", "acme", "globex"], "ACME", 1),
        ("integer", ["7", "7", "8"], "007", 1),
        (
            "uuid",
            ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"] * 2 + ["b1eebc99-9c0b-4ef8-bb6d-6bb9bd380a22"],
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            1,
        ),
    ],
)
@pytest.mark.parametrize("chunking", ["key", "tenant"])
def test_an_override_matches_as_the_tenant_columns_equality_does(
    db, make_user, tenant_type, rows, written, others, chunking
):
    """An override written in another form of the value (case, leading zeros, an upper-case
    uuid) keeps exactly the rows the column's ``=`` says are that tenant's."""
    if tenant_type == "citext":
        _sql("CREATE EXTENSION IF NOT EXISTS citext")
    _sql("DROP TABLE IF EXISTS public.rr_periods")
    _sql(
        f"CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, tenant {tenant_type} NOT NULL,"
        " occurred_at timestamptz NOT NULL)"
    )
    for n, value in enumerate(rows):
        _sql(
            f"INSERT INTO public.rr_periods SELECT g, %s::{tenant_type}, %s - interval '40 days'"
            f" FROM generate_series({n * 100 + 1}, {n * 100 + 10}) AS g",
            [value, NOW],
        )
    _sql("CREATE INDEX ON public.rr_periods (tenant, id)")
    spec = PolicySpec.parse(
        _spec(tenant="tenant", override=[{"tenant": written, "retention": "forever"}])
    )
    where = P.eligible(spec, policy_id=0, cutoff=spec.cutoff_for(NOW), include_holds=False)
    (eligible,) = _sql(*[P.count_where(spec, where).sql, P.count_where(spec, where).params])[0]
    assert eligible == 10 * others
    policy = approved_policy(make_user, **_spec(tenant="tenant", chunking=chunking, override=[
        {"tenant": written, "retention": "forever"}]))  # fmt: skip
    assert _drain(policy).chunking == chunking
    left = _sql("SELECT tenant::text, count(*) FROM public.rr_periods GROUP BY 1 ORDER BY 1")
    assert sum(n for _, n in left) == 10 * (len(rows) - others)
    assert all(
        _sql(f"SELECT %s::{tenant_type} = %s::{tenant_type}", [t, written])[0][0] for t, _ in left
    )


def test_an_override_that_is_not_a_value_of_the_column_or_names_a_tenant_twice_is_refused(
    db, make_user
):
    _sql("DROP TABLE IF EXISTS public.rr_periods")
    _sql(
        "CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, tenant integer NOT NULL,"
        " occurred_at timestamptz NOT NULL)"
    )
    from retention import introspect

    with pytest.raises(SpecError, match="tenant 'acme' is not a value of tenant column"):
        introspect.validate(
            PolicySpec.parse(
                _spec(tenant="tenant", override=[{"tenant": "acme", "retention": "forever"}])
            )
        )
    with pytest.raises(SpecError, match="2 tenant values equal"):
        introspect.validate(
            PolicySpec.parse(
                _spec(
                    tenant="tenant",
                    override=[
                        {"tenant": "7", "retention": "forever"},
                        {"tenant": "007", "retention": "1 year"},
                    ],
                )  # fmt: skip
            )
        )
    with pytest.raises(SpecError, match="needs a tenant column"):
        PolicySpec.parse(_spec(override=[{"tenant": "7", "retention": "forever"}]))
    with pytest.raises(SpecError, match="same column"):
        PolicySpec.parse(_spec(**{"class": [
            {"column": "a", "value": 1, "retention": "1 day"},
            {"column": "b", "value": 1, "retention": "1 day"}]}))  # fmt: skip


@pytest.mark.parametrize("distinct", [3, P.MAX_PERIOD_TESTS + 2])
def test_many_distinct_override_periods_decide_each_row_alike(db, distinct):
    """Up to ``MAX_PERIOD_TESTS`` distinct periods are hashed ``= ANY`` tests, more one
    anti-join over all overrides: each tenant's rows go by its own period either way."""
    _sql("DROP TABLE IF EXISTS public.rr_periods")
    _sql(
        "CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, tenant text NOT NULL,"
        " occurred_at timestamptz NOT NULL)"
    )
    _sql(
        "INSERT INTO public.rr_periods SELECT d * 20 + n, 't' || n,"
        " %s::timestamptz - make_interval(days => d) - interval '1 hour'"
        " FROM generate_series(0, 99) AS d, generate_series(0, 19) AS n",
        [NOW],
    )
    periods = {f"t{n}": f"{30 + n % distinct} days" for n in range(20)}
    spec = PolicySpec.parse(
        _spec(
            tenant="tenant", override=[{"tenant": t, "retention": p} for t, p in periods.items()]
        )  # fmt: skip
    )
    where = P.eligible(spec, policy_id=0, cutoff=spec.cutoff_for(NOW))
    text = P.sql.SQL("SELECT t.tenant, count(*) FROM {} WHERE {} GROUP BY 1").format(
        P.table(spec), where.sql
    )
    assert ("NOT EXISTS (SELECT 1 FROM unnest" in text.as_string(connection.connection)) == (
        distinct > P.MAX_PERIOD_TESTS
    )
    counted = dict(_sql(text.as_string(connection.connection), where.params))
    assert counted == {t: 100 - int(p.split()[0]) for t, p in periods.items()}


def test_versions_built_in_turn_each_decide_by_their_own_overrides(db):
    """A version's override arrays are derived once per parsed version and found again by
    identity, not by value: statements of versions built in turn, and of a version parsed anew
    with the same overrides as one already built, each keep exactly their own tenants."""
    _tenant_table()

    def parsed(kept: str) -> PolicySpec:
        return PolicySpec.parse(
            _spec(tenant="tenant", override=[{"tenant": kept, "retention": "forever"}])
        )

    def eligible_tenants(spec: PolicySpec) -> set:
        where = P.eligible(spec, policy_id=0, cutoff=spec.cutoff_for(NOW), include_holds=False)
        text = P.sql.SQL("SELECT DISTINCT t.tenant FROM {} WHERE {}").format(
            P.table(spec), where.sql
        )
        return {t for (t,) in _sql(text.as_string(connection.connection), where.params)}

    versions = {kept: parsed(kept) for kept in "abc"}
    for _ in range(2):
        for kept, spec in versions.items():
            assert eligible_tenants(spec) == set("abcd") - {kept}
    again = parsed("b")
    assert again.overrides is not versions["b"].overrides
    assert eligible_tenants(again) == set("acd")
    del versions
    assert eligible_tenants(parsed("d")) == set("abc")


def _planning_blocks(spec: PolicySpec, fragment) -> int:
    text = P.sql.SQL("EXPLAIN (BUFFERS, FORMAT JSON) SELECT 1 FROM {} WHERE {}").format(
        P.table(spec), fragment.sql
    )
    ((plan,),) = _sql(text.as_string(connection.connection), fragment.params)
    planning = plan[0]["Planning"]
    return planning["Shared Hit Blocks"] + planning["Shared Read Blocks"]


@pytest.mark.parametrize("entry", ["override", "class"])
def test_a_period_older_than_every_row_is_planned_without_reading_the_deleted_rows(
    transactional_db, entry
):
    """A period's cutoff older than every row the statistics saw is not estimated: planning a
    chunk does not walk the timestamp index's end through the rows the chunk before it deleted
    (dead until a vacuum), as the planner does for the actual oldest row of such a bound."""
    _sql("DROP TABLE IF EXISTS public.rr_periods")
    _sql(
        "CREATE TABLE public.rr_periods (id bigint PRIMARY KEY, tenant text NOT NULL,"
        " occurred_at timestamptz NOT NULL, state text) WITH (autovacuum_enabled = false)"
    )
    _sql(
        "INSERT INTO public.rr_periods SELECT g, 't' || g %% 50, %s::timestamptz"
        " - make_interval(secs => 40 * 86400.0 * (1 - g / 20000.0)), 'done'"
        " FROM generate_series(1, 20000) AS g",
        [NOW],
    )
    _sql("CREATE INDEX ON public.rr_periods (occurred_at)")
    _sql("ANALYZE public.rr_periods")
    extra = (
        {"override": [{"tenant": ["t1", "t2"], "retention": "7 years"}]}
        if entry == "override"
        else {"class": [{"column": "state", "value": "done", "retention": "7 years"}]}
    )
    spec = PolicySpec.parse(_spec(tenant="tenant", **extra))
    where = P.within_periods(spec, spec.cutoff_for(NOW))
    _planning_blocks(spec, where)  # the catalog's rows, read once
    # the oldest rows, deleted (and committed) as a run's first chunks delete them: dead
    # until a vacuum
    _sql("DELETE FROM public.rr_periods WHERE id <= 8000")
    planned = _planning_blocks(spec, where)
    # the same bound as the planner estimates it: it reads the index's end (and, when no
    # older snapshot still needs them, walks the deleted rows there: 80 blocks here)
    bare = P.Fragment(P.sql.SQL("t.occurred_at < %s::timestamptz"), [NOW - 7 * 365 * DAY])
    assert planned < _planning_blocks(spec, bare)
    # and the statement decides each row as before: t1's and t2's rows (a class: every row,
    # all "done") are kept for years; the others' older than the default go
    where = P.eligible(spec, policy_id=0, cutoff=spec.cutoff_for(NOW))
    count = P.count_where(spec, where)
    ((eligible,),) = _sql(count.sql.as_string(connection.connection), count.params)
    kept = {"override": "tenant NOT IN ('t1', 't2')", "class": "FALSE"}[entry]
    ((expected,),) = _sql(
        f"SELECT count(*) FROM public.rr_periods WHERE occurred_at < %s AND {kept}",
        [NOW - 20 * DAY],
    )
    assert eligible == expected
    assert (expected > 0) == (entry == "override")
    _sql("DROP TABLE public.rr_periods")
