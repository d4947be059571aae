"""Archive, then delete: each chunk's rows in a verified Parquet file before its DELETE commits."""

from __future__ import annotations

from datetime import timedelta

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from django.db import connection
from django.utils import timezone

from retention.actions import place_hold
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence import audit
from runs.models import AuditRecord, Chunk, Run
from tests.archive.conftest import full, read_only, typed_spec
from tests.factories import approved_policy
from tests.runs.conftest import NOW

COLUMNS = (
    "id, tenant_id, occurred_at, status, amount, exact, small, ratio, flag, day, local_at,"
    " doc, js, raw, tags, nums, prices, ref, span"
)


def _snapshot(where: str = "TRUE", params=None) -> dict:
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, tenant_id, occurred_at, status, amount, exact::text, small, ratio, flag,"
            f" day, local_at, doc::text, js::text, raw, tags, nums, prices, ref::text, span::text"
            f" FROM public.rr_typed WHERE {where} ORDER BY id",
            params or [],
        )
        return {row[0]: row for row in cur.fetchall()}


def test_every_column_type_reads_back_exactly_with_pyarrow_and_duckdb(
    typed_policy, archive_dir, no_guard
):
    run, _ = trigger_run(typed_policy, tick=NOW)
    eligible = _snapshot("occurred_at < %s AND status <> 'disputed'", [run.cutoff])
    assert len(eligible) > 100
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert _snapshot("id = ANY(%s)", [list(eligible)]) == {}

    files = sorted(archive_dir.rglob("*.parquet"))
    assert files
    schema = pq.read_schema(files[0])
    assert schema.field("amount").type == pa.decimal128(14, 4)
    assert schema.field("occurred_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("raw").type == pa.binary()
    assert schema.field("prices").type == pa.list_(pa.decimal128(8, 2))
    assert schema.field("doc").metadata[b"pg_type"] == b"jsonb"
    rows = {}
    for f in files:
        for rec in pq.read_table(f).to_pylist():
            rows[rec["id"]] = rec
    assert set(rows) == set(eligible)
    for key, want in eligible.items():
        got = rows[key]
        (_, tenant, at, status, amount, exact, small, ratio, flag, day, local_at, doc, js, raw,
         tags, nums, prices, ref, span) = want  # fmt: skip
        assert (got["tenant_id"], got["occurred_at"], got["status"]) == (tenant, at, status)
        assert (got["amount"], got["exact"], got["small"]) == (amount, exact, small)
        assert (got["ratio"], got["flag"], got["day"], got["local_at"]) == (
            ratio,
            flag,
            day,
            local_at,
        )
        assert (got["doc"], got["js"], got["raw"]) == (doc, js, raw)
        assert (got["tags"], got["nums"], got["prices"]) == (tags, nums, prices)
        assert (got["ref"], got["span"]) == (ref, span)

    # independently: DuckDB reads the same files, every row and every column as it was
    con = duckdb.connect()
    glob = str(archive_dir / "**" / "*.parquet")
    n, total_amount = con.execute(
        f"SELECT count(*), sum(amount) FROM read_parquet('{glob}')"
    ).fetchone()
    assert n == len(eligible)
    assert total_amount == sum(v[4] for v in eligible.values() if v[4] is not None)
    duck = con.execute(f"SELECT {COLUMNS} FROM read_parquet('{glob}') ORDER BY id").fetchall()
    assert [row[0] for row in duck] == sorted(eligible)
    assert any(None in row for row in duck)  # the rows with NULLs are among them
    for got in duck:
        assert tuple(got) == tuple(eligible[got[0]]), got[0]

    records = list(AuditRecord.objects.filter(run=run))
    assert all(r.chain_version == audit.ARCHIVE_CHAIN_VERSION for r in records)
    assert sum(o["rows"] for r in records for o in r.archive["objects"]) == len(eligible)
    assert sum(r.rows_deleted for r in records) == len(eligible)
    assert audit.verify_chain().ok


def test_a_read_only_destination_fails_the_chunk_before_any_delete(
    typed_policy, archive_dir, no_guard
):
    run, _ = trigger_run(typed_policy, tick=NOW)
    before = _snapshot()
    planner.plan(run)
    with read_only(archive_dir):
        outcome = worker.process_one(run)
    assert outcome.kind == worker.FAILED
    assert "Read-only file system" in outcome.reason or "Permission denied" in outcome.reason
    assert _snapshot() == before
    assert not AuditRecord.objects.exists()
    chunk = Chunk.objects.get(pk=outcome.chunk_id)
    assert chunk.state == Chunk.State.PENDING and chunk.attempts == 1
    assert "archive destination" in chunk.last_error or "archive" in outcome.reason
    assert not list(archive_dir.rglob("*.parquet"))
    # writable again: the same chunk archives and deletes on its next attempt
    Chunk.objects.filter(pk=chunk.pk).update(not_before=timezone.now())
    again = worker.process_one(run, chunk_id=chunk.pk)
    assert again.kind == worker.DONE and again.rows > 0
    record = AuditRecord.objects.get(chunk_id=chunk.pk)
    assert record.archive["objects"][0]["rows"] == record.rows_deleted == again.rows


def test_a_full_destination_fails_the_chunk_before_any_delete(typed_policy, archive_dir, no_guard):
    run, _ = trigger_run(typed_policy, tick=NOW)
    before = _snapshot()
    planner.plan(run)
    with full(archive_dir):
        outcome = worker.process_one(run)
        # no object, nor a partial one left behind
        assert [p.name for p in archive_dir.rglob("*") if p.is_file()] == ["filler"]
    assert outcome.kind == worker.FAILED
    assert "No space left on device" in outcome.reason
    assert _snapshot() == before
    assert not AuditRecord.objects.exists()
    chunk = Chunk.objects.get(pk=outcome.chunk_id)
    assert chunk.state == Chunk.State.PENDING and chunk.attempts == 1
    assert "No space left on device" in chunk.last_error
    # room again: the same chunk archives and deletes on its next attempt
    Chunk.objects.filter(pk=chunk.pk).update(not_before=timezone.now())
    again = worker.process_one(run, chunk_id=chunk.pk)
    assert again.kind == worker.DONE and again.rows > 0
    record = AuditRecord.objects.get(chunk_id=chunk.pk)
    assert record.archive["objects"][0]["rows"] == record.rows_deleted == again.rows


def test_held_rows_are_neither_archived_nor_deleted(typed_policy, archive_dir, make_user, no_guard):
    officer = make_user("carol", "compliance")
    place_hold(actor=officer, reason="litigation", policy=typed_policy, tenant="2")
    run, _ = trigger_run(typed_policy, tick=NOW)
    held = _snapshot("tenant_id = 2")
    eligible = _snapshot(
        "tenant_id <> 2 AND occurred_at < %s AND status <> 'disputed'", [run.cutoff]
    )
    assert held and eligible
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert _snapshot("tenant_id = 2") == held
    archived = [
        rec
        for f in archive_dir.rglob("*.parquet")
        for rec in pq.read_table(f, columns=["id", "tenant_id"]).to_pylist()
    ]
    assert sorted(r["id"] for r in archived) == sorted(eligible)
    assert not [r for r in archived if r["tenant_id"] == 2]


def test_time_real_char_oid_and_domain_columns_read_back_exactly_and_an_infinite_timestamp_fails_the_chunk(
    db, make_user, archive_dir, no_guard
):
    with connection.cursor() as cur:
        cur.execute("CREATE DOMAIN public.rr_amount AS bigint CHECK (VALUE >= 0)")
        cur.execute(
            "CREATE TABLE public.rr_more (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, at_time time, ratio real,"
            " code char(5), obj oid, amount public.rr_amount, name_col name, note varchar(20))"
        )
        cur.execute(
            "INSERT INTO public.rr_more SELECT g, 1 + g %% 3,"
            " %s::timestamptz - make_interval(hours => 3 * (300 - g)),"
            " 'closed', CASE WHEN g %% 5 = 0 THEN NULL ELSE TIME '23:59:59.999999' - make_interval(secs => g) END,"
            " CASE WHEN g %% 5 = 1 THEN NULL ELSE g / 7.0::real END,"
            " CASE WHEN g %% 5 = 2 THEN NULL ELSE 'ab' END, g * 1000003, g * 10, 'n' || g, 'é' || g"
            " FROM generate_series(1, 300) AS g",
            [NOW],
        )
    policy = approved_policy(make_user, **typed_spec(archive_dir, slug="more", table="rr_more"))
    run, _ = trigger_run(policy, tick=NOW)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, at_time, ratio::float8, code, obj, amount, name_col::text, note"
            " FROM public.rr_more"
            " WHERE occurred_at < %s ORDER BY id",
            [run.cutoff],
        )
        want = cur.fetchall()
    assert len(want) > 100 and any(None in row for row in want)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    table = pa.concat_tables(pq.read_table(f) for f in sorted(archive_dir.rglob("*.parquet")))
    assert table.schema.field("at_time").type == pa.time64("us")
    assert table.schema.field("ratio").type == pa.float32()
    assert table.schema.field("amount").type == pa.int64()
    got = sorted(
        (
            r["id"],
            r["at_time"],
            r["ratio"],
            r["code"],
            r["obj"],
            r["amount"],
            r["name_col"],
            r["note"],
        )
        for r in table.to_pylist()
    )
    assert got == [tuple(row) for row in want]

    # an infinite timestamp has no Parquet value: its chunk fails, nothing deleted
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_more (id, tenant_id, occurred_at, status)"
            " VALUES (1000, 1, '-infinity', 'closed')"
        )
    run, _ = trigger_run(policy, tick=NOW + timedelta(days=1))
    planner.plan(run)
    outcome = worker.process_one(run)
    assert outcome.kind == worker.FAILED
    assert "an infinite timestamptz cannot be archived in Parquet" in outcome.reason
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.rr_more WHERE id = 1000")
        assert cur.fetchone()[0] == 1
