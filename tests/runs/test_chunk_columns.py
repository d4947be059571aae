"""Chunk bounds on other columns than the key (a run's ``chunk_columns``: ``(timestamp,
key…)`` or ``(timestamp,)``): a chunk's scope, a discarded scope and the audit record are on
those columns, compared as a row, while legal holds and eligibility go by the key; the record
names the columns (chain version 6) and the evidence shows them."""

from __future__ import annotations

import csv
import io

import pytest
from django.db import connection
from django.urls import reverse

from retention import actions as retention_actions
from retention import predicate as P
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import audit
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW
from tests.security.test_audit_anchor import as_owner

COLUMNS = ["occurred_at", "id"]


@pytest.fixture
def random_keys(db, settings):
    """``public.rr_cc``: a random bigint key, three tenants, rows a minute apart in time
    order (in [NOW − 1000 min, NOW)); a policy keeping 'disputed' rows older than 10 hours."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_cc (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text)"
        )
        cur.execute(
            "INSERT INTO public.rr_cc SELECT ('x' || substr(md5(g::text), 1, 15))::bit(60)::bigint,"
            " g %% 3, %s::timestamptz - make_interval(mins => 1001 - g),"
            " CASE WHEN g %% 11 = 0 THEN 'disputed' ELSE 'closed' END"
            " FROM generate_series(1, 1000) AS g",
            [NOW],
        )
        cur.execute("CREATE INDEX ON public.rr_cc (occurred_at, id)")
        cur.execute("CREATE INDEX ON public.rr_cc (tenant_id, id)")


def _policy(make_user):
    return approved_policy(
        make_user, slug="cc", table="public.rr_cc", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="10 hours", schedule="0 3 * * *", chunk_size=100,
        keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )  # fmt: skip


def _bound(where: str) -> list[str]:
    """(occurred_at, id) of the first row matching ``where``, as texts."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT occurred_at::text, id::text FROM public.rr_cc"
            f" WHERE {where} ORDER BY occurred_at, id LIMIT 1"
        )
        return list(cur.fetchone())


def _count(where: str, params=()) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM public.rr_cc WHERE {where}", list(params))
        return cur.fetchone()[0]


def test_a_chunk_on_timestamp_columns_deletes_its_range_and_its_record_names_them(
    random_keys, make_user, client
):
    policy = _policy(make_user)
    keeper = make_user("keeper", "compliance")
    held_to = 2**58  # a key-range hold: by the key, inside the timestamp range
    retention_actions.place_hold(
        actor=keeper, reason="litigation", policy=policy, key_from=0, key_to=held_to
    )
    run, _ = trigger_run(policy, tick=NOW)
    Run.objects.filter(pk=run.pk).update(
        chunking="timestamp", chunk_columns=COLUMNS, planner_done=True
    )
    run.refresh_from_db()
    lo = _bound("occurred_at >= '2026-11-29 21:00+00'")  # NOW − 900 minutes
    hi = _bound("occurred_at >= '2026-11-29 22:40+00'")  # 100 rows later
    chunk = Chunk.objects.create(run=run, tenant="", seq=0, lo=lo, hi=hi, planned_rows=100)

    outcome = worker.process_one(run)
    assert outcome.kind == worker.DONE, outcome.reason

    in_range = "(occurred_at, id) >= (%s::timestamptz, %s::bigint)" \
        " AND (occurred_at, id) < (%s::timestamptz, %s::bigint)"  # fmt: skip
    unheld = "status = 'closed' AND NOT (id >= 0 AND id < %s)"
    assert _count(f"{in_range} AND {unheld}", [*lo, *hi, held_to]) == 0
    assert _count(f"{in_range} AND id >= 0 AND id < %s", [*lo, *hi, held_to]) > 0  # held
    assert _count(f"{in_range} AND status = 'disputed'", [*lo, *hi]) > 0  # kept
    assert _count(f"NOT ({in_range})", [*lo, *hi]) == 1000 - 100  # nothing outside it
    record = AuditRecord.objects.get(chunk=chunk)
    assert (record.chain_version, record.bound_columns) == (
        audit.BOUND_COLUMNS_CHAIN_VERSION, COLUMNS,
    )  # fmt: skip
    assert (record.key_lo, record.key_hi, record.key_from) == (lo, hi, None)
    assert sum(record.tenant_rows.values()) == record.rows_deleted > 0
    assert record.interval == f"(occurred_at, id) [({lo[0]}, {lo[1]}), ({hi[0]}, {hi[1]}))"
    assert audit.verify_chain().ok

    client.force_login(make_user("auditor", "auditor"))
    response = client.get(reverse("runs:audit_export") + f"?run={run.pk}")
    (row,) = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert row["bounds_on"] == "occurred_at, id"
    client.force_login(make_user("viewer", "oncall"))
    assert (
        "bounds on <code>occurred_at, id</code>" in client.get(f"/runs/{run.pk}/").content.decode()
    )

    # an owner who says the bounds were on other columns is caught by the chain
    as_owner(("UPDATE runs_auditrecord SET bound_columns = '[\"id\"]' WHERE id = %s", [record.pk]))
    assert f"record {record.chain_seq}: content does not match its hash" in (
        audit.verify_chain().problems
    )


def test_a_discarded_scope_on_timestamp_columns_is_left_out_by_its_columns(random_keys, make_user):
    policy = _policy(make_user)
    spec = policy.approved_version.parsed
    cutoff = NOW.replace(hour=2)
    lo = _bound("occurred_at >= '2026-11-29 20:00+00'")
    hi = _bound("occurred_at >= '2026-11-29 22:00+00'")
    scope = P.Scope(None, lo, hi, tuple(COLUMNS))
    assert P.in_scope(spec, tenant=None, key_from=lo, key_to=hi, columns=COLUMNS).params == [
        *lo,
        *hi,
    ]

    def eligible(outside=()) -> int:
        frag = P.count_where(
            spec, P.eligible(spec, policy_id=policy.pk, cutoff=cutoff, outside=outside)
        )
        with connection.cursor() as cur:
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            return cur.fetchone()[0]

    inside = _count(
        "(occurred_at, id) >= (%s::timestamptz, %s::bigint) AND (occurred_at, id) <"
        " (%s::timestamptz, %s::bigint) AND status = 'closed' AND occurred_at < %s",
        [*lo, *hi, cutoff],
    )
    assert 100 < inside < 120  # two hours of rows, less the kept ones
    assert eligible() - eligible([scope]) == inside
    # the same scope on the key's columns would be a key interval: a different set of rows
    key_scope = P.Scope(None, [lo[1]], [hi[1]])
    assert eligible() - eligible([key_scope]) != inside
