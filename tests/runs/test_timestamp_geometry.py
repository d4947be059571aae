"""Chunks in timestamp order (``chunking = "timestamp"``): on a table keyed by a random uuid
whose rows arrive in time order, ``auto`` orders chunks by ``(timestamp, key)`` (or by the
timestamp alone on a plain timestamp index) from the statistics; the chunks drain exactly
under the invariant checker, touch disjoint runs of heap pages, are split, discarded and
audited on those columns — while legal holds, keep rules and NULL keys still go by the key."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from retention import actions as retention_actions
from retention import geometry
from retention import predicate as P
from retention.models import Policy, PolicyVersion
from retention.preview import preview
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence import audit, exports
from runs.evidence.invariants import HoldScope, Shadow, check_run
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW
from tests.runs.test_partitions import parts, parts_spec
from tests.security.test_audit_anchor import as_owner

__all__ = ["parts"]

RANDOM_UUID = "md5(g::text)::uuid"
RANDOM_BIGINT = "('x' || substr(md5(g::text), 1, 15))::bit(60)::bigint"


def _table(
    rows: int = 6000,
    *,
    key: str = RANDOM_UUID,
    key_type: str = "uuid",
    index: str = "occurred_at, id",
    ties: bool = False,
    analyze: bool = True,
) -> None:
    """``public.rr_ts``: a key of ``key`` (random by default), five tenants on every page, rows
    inserted in time order over 40 days before NOW (on the hour with ``ties``: about 60 rows
    share each timestamp); every 17th row 'disputed'. Shadow copy beside it."""
    at = "%s::timestamptz - make_interval(secs => (40 * 86400.0) * (1 - g::float8 / %s))"
    if ties:
        at = f"date_trunc('hour', {at})"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_ts, public.rr_ts_shadow")
        cur.execute(
            f"CREATE TABLE public.rr_ts (id {key_type} PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text)"
        )
        cur.execute(
            f"INSERT INTO public.rr_ts SELECT {key}, 1 + g %% 5, {at},"
            " CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed' END, repeat('x', 60)"
            " FROM generate_series(1, %s) AS g",
            [NOW, rows, rows],
        )
        cur.execute("CREATE INDEX ON public.rr_ts (tenant_id, id)")
        if index:
            cur.execute(f"CREATE INDEX ON public.rr_ts ({index})")
        cur.execute("CREATE TABLE public.rr_ts_shadow AS SELECT * FROM public.rr_ts")
        if analyze:
            cur.execute("ANALYZE public.rr_ts")


def _spec(**overrides) -> dict:
    spec = dict(
        slug="uuid-events",
        table="public.rr_ts",
        key="id",
        timestamp="occurred_at",
        tenant="tenant_id",
        retention="20 days",
        schedule="0 3 * * *",
        chunk_size=200,
        keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )
    spec.update(overrides)
    return spec


def _drain(run: Run) -> Run:
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    return run


def _pages_per_chunk(run: Run) -> list[set[int]]:
    spec = run.policy_version.parsed
    out = []
    for chunk in Chunk.objects.filter(run=run).order_by("seq", "id"):
        lo, hi = chunk.bounds()
        tenant = chunk.tenant if run.per_tenant(spec) else None
        scope = P.in_scope(
            spec, tenant=tenant, key_from=lo, key_to=hi, columns=run.bound_columns(spec)
        )
        with connection.cursor() as cur:
            cur.execute(
                "SELECT DISTINCT (ctid::text::point)[0]::int FROM"
                f" {P.table(spec).as_string(cur.connection)}"
                f" WHERE {scope.sql.as_string(cur.connection)} AND occurred_at < %s",
                [*scope.params, run.cutoff],
            )
            out.append({row[0] for row in cur.fetchall()})
    return out


def _shared(pages: list[set[int]]) -> int:
    """The most chunks any one heap page is read by."""
    return max(Counter(p for chunk in pages for p in chunk).values())


def test_auto_orders_chunks_by_timestamp_and_key_when_the_key_is_random_and_drains_exactly(
    no_guard, make_user, client
):
    _table()
    policy = approved_policy(make_user, **_spec())
    shape = geometry.choose(policy.approved_version.parsed)
    assert shape.kind == "timestamp" and shape.columns == ("occurred_at", "id")
    assert re.fullmatch(
        r"key id is not in heap order \(correlation -?0\.\d\d\), occurred_at is \(1\.00\):"
        r" timestamp-ordered chunks on \(occurred_at, id\)",
        shape.reason,
    ), shape.reason

    run, _ = trigger_run(policy, tick=NOW)
    assert (run.chunking, run.chunking_reason, run.chunk_columns) == (
        "timestamp", shape.reason, ["occurred_at", "id"],
    )  # fmt: skip
    run = _drain(run)
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_ts_shadow")) == []
    chunks = list(Chunk.objects.filter(run=run, pass_no=1).order_by("seq"))
    # two first chunks of the policy's 200 keys, then 16× that at most: ~3,000 keys take three
    assert len(chunks) >= 3 and all(c.key_from is None and len(c.lo) == 2 for c in chunks)
    assert {c.tenant for c in chunks} == {""}  # across tenants, like key-range chunks

    # every record names the columns its bounds are on, and counts rows per tenant
    records = list(AuditRecord.objects.filter(run=run))
    assert {r.chain_version for r in records} == {audit.BOUND_COLUMNS_CHAIN_VERSION}
    assert {tuple(r.bound_columns) for r in records} == {("occurred_at", "id")}
    assert all(sum(r.tenant_rows.values()) == r.rows_deleted for r in records)
    assert records[0].interval.startswith(f"(occurred_at, id) [({records[0].key_lo[0]}, ")

    # the run page, retention explain and the preview say what was chosen, on which columns
    client.force_login(make_user("viewer", "oncall"))
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "bounds on <code>occurred_at, id</code>" in html and shape.reason in html
    out = StringIO()
    call_command("retention", "explain", policy.slug, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"== chunking: timestamp on (occurred_at, id) — {shape.reason}"
    window = lines[lines.index("== planner: one window (chunk boundaries from the key index)") :]
    window = "\n".join(window[1 : window.index("== worker: chunk DELETE (rolled back)")])
    assert "Index Only Scan using rr_ts_occurred_at_id_idx" in window  # along the timestamp
    found = preview(policy.approved_version.parsed, policy_id=policy.pk)["chunking"]
    assert found == {
        "kind": "timestamp",
        "reason": shape.reason,
        "bounds_on": ["occurred_at", "id"],
    }


def test_timestamp_chunks_touch_their_own_pages_where_key_ranges_over_a_uuid_share_them(
    no_guard, make_user
):
    """What lets two workers scale on a random key: consecutive chunks meet on at most one
    page. Key-range chunks over the same uuid key read pages all over the heap."""
    _table()
    by_time, _ = trigger_run(approved_policy(make_user, **_spec()), tick=NOW)
    by_key, _ = trigger_run(approved_policy(make_user, **_spec(slug="by-key", chunking="key")), tick=NOW)  # fmt: skip
    planner.plan(by_time, window=1000)
    planner.plan(by_key, window=1000)
    assert (by_time.chunking, by_key.chunking) == ("timestamp", "key")
    time_pages, key_pages = _pages_per_chunk(by_time), _pages_per_chunk(by_key)
    assert len(time_pages) > 5 and len(key_pages) > 5
    assert _shared(time_pages) <= 2
    assert _shared(key_pages) >= 5


def test_on_a_plain_timestamp_index_chunks_are_timestamp_ranges_across_ties(no_guard, make_user):
    """No index on (timestamp, key): the bounds are timestamps alone, half-open on distinct
    values; about 60 rows share each timestamp, so chunk ends fall between ties."""
    _table(index="occurred_at", ties=True)
    policy = approved_policy(make_user, **_spec(chunk_size=50))
    run, _ = trigger_run(policy, tick=NOW)
    assert (run.chunking, run.chunk_columns) == ("timestamp", ["occurred_at"])
    assert run.chunking_reason.endswith("timestamp-ordered chunks on occurred_at")
    run = _drain(run)
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_ts_shadow")) == []
    chunks = list(Chunk.objects.filter(run=run, pass_no=1).order_by("seq"))
    assert all(len(c.lo) == 1 for c in chunks)
    bounds = [c.lo[0] for c in chunks]
    assert len(set(bounds)) == len(bounds)  # each tie starts at most one chunk
    records = AuditRecord.objects.filter(run=run)
    assert {tuple(r.bound_columns) for r in records} == {("occurred_at",)}


def test_pinned_timestamp_chunking_needs_an_index_leading_with_the_timestamp(no_guard, make_user):
    _table(index="")
    author = make_user("author", "compliance")
    with pytest.raises(SpecError) as excinfo:
        retention_actions.apply_spec(PolicySpec.parse(_spec(chunking="timestamp")), author=author)
    assert str(excinfo.value) == (
        'chunking = "timestamp" needs a valid, non-partial btree index on public.rr_ts leading'
        " with 'occurred_at': chunks in timestamp order are planned and deleted along it;"
        " create one first"
    )
    assert not Policy.objects.exists() and not PolicyVersion.objects.exists()
    # a partial index does not count; a plain one does
    with connection.cursor() as cur:
        cur.execute("CREATE INDEX rr_ts_recent ON public.rr_ts (occurred_at) WHERE tenant_id = 1")
    with pytest.raises(SpecError):
        retention_actions.apply_spec(PolicySpec.parse(_spec(chunking="timestamp")), author=author)
    with connection.cursor() as cur:
        cur.execute("CREATE INDEX rr_ts_at ON public.rr_ts (occurred_at)")
    version = retention_actions.apply_spec(
        PolicySpec.parse(_spec(chunking="timestamp")), author=author
    )
    assert version.parsed.chunking == "timestamp"


def test_auto_goes_by_statistics_a_timestamp_index_and_a_key_out_of_heap_order(no_guard, make_user):
    _table(analyze=False)  # no ANALYZE yet: pg_stats has no correlation to go by
    spec = approved_policy(make_user, **_spec()).approved_version.parsed
    assert geometry.choose(spec).kind == "key"  # today's rules: tenants interleave
    with connection.cursor() as cur:
        cur.execute("ANALYZE public.rr_ts")
    assert geometry.choose(spec).kind == "timestamp"
    with connection.cursor() as cur:
        cur.execute("DROP INDEX public.rr_ts_occurred_at_id_idx")
    shape = geometry.choose(spec)  # statistics, but no index leading with the timestamp
    assert shape.kind == "key" and shape.reason.startswith("tenants interleave on 100% of")
    # a key in heap order keeps key-range chunks (they follow the heap already)
    _table(key="g", key_type="bigint")
    assert geometry.choose(spec).kind == "key"
    # the same for a key that leads with the timestamp
    keyed_by_time = approved_policy(
        make_user, **_spec(slug="by-time", key=["occurred_at", "id"], tenant=None)
    ).approved_version.parsed
    assert geometry.choose(keyed_by_time).kind == "key"
    _table()
    assert geometry.choose(spec).columns == ("occurred_at", "id")


def test_a_key_range_hold_holds_on_timestamp_chunks_by_the_real_key(no_guard, make_user):
    """Chunks are timestamp ranges, the hold a range of the (random bigint) key: inside every
    chunk the DELETE leaves the held keys alone; the run drains with them deferred."""
    _table(key=RANDOM_BIGINT, key_type="bigint")
    policy = approved_policy(make_user, **_spec())
    keeper = make_user("keeper", "compliance")
    held_to = 2**58  # about a quarter of the keys (they are in [0, 2^60))
    retention_actions.place_hold(
        actor=keeper, reason="litigation", policy=policy, key_from=0, key_to=held_to
    )
    run, _ = trigger_run(policy, tick=NOW)
    assert (run.chunking, run.chunk_columns) == ("timestamp", ["occurred_at", "id"])
    run = _drain(run)
    assert run.state == Run.State.DRAINED
    assert (
        check_run(run, shadow=Shadow("public", "rr_ts_shadow"), holds=[HoldScope(None, 0, held_to)])
        == []
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE id >= 0 AND id < %s), count(*) FILTER (WHERE id >= %s)"
            " FROM public.rr_ts WHERE occurred_at < %s AND status = 'closed'",
            [held_to, held_to, run.cutoff],
        )
        held_left, unheld_left = cur.fetchone()
    assert held_left > 100 and unheld_left == 0
    assert run.verification["remaining"] == 0
    assert run.verification["deferred_by_holds"] == held_left


def test_a_tenant_hold_on_a_uuid_key_holds_its_tenant_on_timestamp_chunks(no_guard, make_user):
    """A uuid key has no integer order for a key interval (refused, tests/retention/
    test_hold_key_intervals.py): a tenant's hold covers its rows whole, in every timestamp
    chunk."""
    _table()
    policy = approved_policy(make_user, **_spec())
    keeper = make_user("keeper", "compliance")
    retention_actions.place_hold(actor=keeper, reason="litigation", policy=policy, tenant="3")
    run, _ = trigger_run(policy, tick=NOW)
    assert run.chunking == "timestamp"
    run = _drain(run)
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_ts_shadow"), holds=[HoldScope("3")]) == []
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tenant_id, count(*) FROM public.rr_ts WHERE occurred_at < %s"
            " AND status = 'closed' GROUP BY 1",
            [run.cutoff],
        )
        left = dict(cur.fetchall())
    assert set(left) == {3} and left[3] > 100
    assert run.verification["deferred_by_holds"] == left[3]
    audited = Counter()
    for r in AuditRecord.objects.filter(run=run):
        audited.update(r.tenant_rows)
    assert "3" not in audited and set(audited) == {"1", "2", "4", "5"}


def test_a_timestamp_chunk_is_split_and_discarded_on_its_own_columns(no_guard, make_user):
    _table()
    policy = approved_policy(make_user, **_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=1)
    chunk = Chunk.objects.filter(run=run).order_by("id").first()
    lo, hi = chunk.bounds()
    assert hi is not None and len(lo) == 2

    assert worker._split(chunk, 0)
    halves = sorted(Chunk.objects.filter(parent=chunk), key=lambda c: c.id)
    assert halves[0].bounds()[0] == lo and halves[1].bounds()[1] == hi
    middle = halves[0].bounds()[1]
    assert halves[1].bounds()[0] == middle  # they meet at the median (timestamp, key)
    in_chunk = (
        " FROM public.rr_ts WHERE (occurred_at, id) >= (%s::timestamptz, %s::uuid)"
        " AND (occurred_at, id) < (%s::timestamptz, %s::uuid)"
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE (occurred_at, id) < (%s::timestamptz, %s::uuid)),"
            " count(*), count(*) FILTER (WHERE occurred_at < %s AND status <> 'disputed')"
            + in_chunk,
            [*middle, run.cutoff, *lo, *hi],
        )
        first_half, keys, eligible = cur.fetchone()
    # planned: the keys in its range (what it can delete at most), split at their middle
    assert keys == chunk.planned_rows > eligible > 0
    assert first_half == chunk.planned_rows // 2

    # a discarded scope of such a chunk is a (timestamp, key) interval: left out of the count
    spec = run.policy_version.parsed
    scope = P.Scope(None, lo, hi, run.bound_columns(spec))
    everything = P.eligible(spec, policy_id=policy.pk, cutoff=run.cutoff)
    outside = P.eligible(spec, policy_id=policy.pk, cutoff=run.cutoff, outside=[scope])
    with connection.cursor() as cur:
        counts = []
        for where in (everything, outside):
            frag = P.count_where(spec, where)
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            counts.append(cur.fetchone()[0])
    assert counts[0] - counts[1] == eligible


def test_the_evidence_names_the_columns_and_the_chain_covers_them(no_guard, make_user, client):
    _table()
    run = _drain(trigger_run(approved_policy(make_user, **_spec()), tick=NOW)[0])
    _table()  # the same rows again, for key-range chunks: version 5 records beside version 6
    key_run, _ = trigger_run(
        approved_policy(make_user, **_spec(slug="by-key", chunking="key")), tick=NOW
    )
    key_run = _drain(key_run)
    assert run.state == key_run.state == Run.State.DRAINED
    assert {r.chain_version for r in AuditRecord.objects.filter(run=key_run)} == {
        audit.TENANT_ROWS_CHAIN_VERSION
    }
    assert audit.verify_chain().ok

    client.force_login(make_user("auditor", "auditor"))
    response = client.get(reverse("runs:audit_export") + f"?run={run.run_key}")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows and {r["bounds_on"] for r in rows} == {"occurred_at, id"}
    assert all(len(json.loads(r["key_lo"])) == 2 for r in rows)
    response = client.get(reverse("runs:audit_export") + f"?run={key_run.run_key}")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {r["bounds_on"] for r in rows} == {""}  # the policy's key
    manifest = json.loads("".join(exports.manifest_json(run)))
    assert manifest["run"]["chunking"] == "timestamp"
    assert manifest["run"]["bounds_on"] == ["occurred_at", "id"]
    assert manifest["audit_chain"]["run_records"]["ok"]

    # an owner who says the bounds were on other columns is caught by the chain
    record = AuditRecord.objects.filter(run=run).order_by("chain_seq").first()
    as_owner(
        (
            'UPDATE runs_auditrecord SET bound_columns = \'["id", "occurred_at"]\''
            " WHERE chain_seq = %s",
            [record.chain_seq],
        )
    )
    assert f"record {record.chain_seq}: content does not match its hash" in (
        audit.verify_chain().problems
    )


@pytest.mark.django_db(transaction=True)
def test_a_partitioned_table_drops_partitions_by_the_key_and_chunks_the_rest_by_timestamp(
    parts, make_user
):
    """Partitions taken whole keep their key bounds (chain version 3); the straddling and
    newer partitions' rows go in timestamp chunks over the parent (version 6)."""
    with connection.cursor() as cur:
        cur.execute("CREATE INDEX ON public.rr_parts (occurred_at, id)")
    policy = approved_policy(make_user, **parts_spec(chunking="timestamp"))
    run, _ = trigger_run(policy, tick=NOW)
    assert (run.chunking, run.chunk_columns) == ("timestamp", ["occurred_at", "id"])
    run = _drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []
    versions = Counter(AuditRecord.objects.filter(run=run).values_list("chain_version", flat=True))
    assert versions[audit.PARTITION_CHAIN_VERSION] >= 1
    assert versions[audit.BOUND_COLUMNS_CHAIN_VERSION] >= 1
    whole = AuditRecord.objects.filter(run=run, partition__isnull=False)
    assert all(r.key_from is not None and r.bound_columns is None for r in whole)
