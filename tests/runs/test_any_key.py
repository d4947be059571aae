"""Keys of any btree-ordered type: the bounds a chunk is planned, deleted, split and audited
by are the key columns' values, stored losslessly as text and cast back in the DELETE; the
audit chain covers them and the run's surfaces show them readably."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from retention import predicate as P
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence import audit, exports
from runs.evidence.invariants import Shadow, check_run
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW
from tests.security.test_audit_anchor import as_owner


def _uuid_table(rows: int = 600) -> None:
    """``public.rr_uuid``: a random uuid key, three tenants, a row a minute back from NOW."""
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_uuid, public.rr_uuid_shadow")
        cur.execute(
            "CREATE TABLE public.rr_uuid (id uuid PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text)"
        )
        cur.execute(
            "INSERT INTO public.rr_uuid SELECT md5(g::text)::uuid, g %% 3,"
            " %s::timestamptz - make_interval(mins => 60 * g), 'closed'"
            " FROM generate_series(1, %s) AS g",
            [NOW, rows],
        )
        cur.execute("CREATE INDEX ON public.rr_uuid (tenant_id, id)")
        cur.execute("CREATE TABLE public.rr_uuid_shadow AS SELECT * FROM public.rr_uuid")
        cur.execute("ANALYZE public.rr_uuid")


@pytest.fixture
def uuid_policy(db, make_user, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    _uuid_table()
    return approved_policy(
        make_user,
        slug="uuids",
        table="public.rr_uuid",
        key="id",
        timestamp="occurred_at",
        tenant="tenant_id",
        retention="10 days",
        schedule="0 3 * * *",
        chunk_size=50,
        chunking="tenant",  # per-tenant chunks: one tenant's uuid interval each
    )


def test_a_uuid_key_run_is_audited_with_its_bounds_and_the_chain_covers_them(uuid_policy):
    run, _ = trigger_run(uuid_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_uuid_shadow")) == []

    records = list(AuditRecord.objects.filter(run=run).order_by("chain_seq"))
    assert sum(r.rows_deleted for r in records) == 600 - 10 * 24
    assert {r.chain_version for r in records} == {audit.BOUNDS_CHAIN_VERSION}
    first = records[0]
    assert first.key_from is None and len(first.key_lo) == 1
    assert first.interval.startswith(f"[{first.key_lo[0]}, ")
    # the manifest lists every chunk's bounds as the key's texts
    manifest = json.loads("".join(exports.manifest_json(run)))
    assert {tuple(c["key_lo"]) for c in manifest["chunks"]} == {
        tuple(c.lo) for c in Chunk.objects.filter(run=run)
    }
    assert audit.verify_chain().ok

    # an owner who moves a record's bounds is caught by the chain
    as_owner(
        (
            "UPDATE runs_auditrecord SET key_lo = '[\"00000000-0000-0000-0000-000000000000\"]'"
            " WHERE chain_seq = %s",
            [first.chain_seq],
        )
    )
    assert f"record {first.chain_seq}: content does not match its hash" in (
        audit.verify_chain().problems
    )


def test_a_uuid_chunk_is_split_at_its_median_key_into_halves_that_cover_it(uuid_policy):
    run, _ = trigger_run(uuid_policy, tick=NOW)
    planner.plan(run, window=1)
    chunk = Chunk.objects.filter(run=run).order_by("id").first()
    lo, hi = chunk.bounds()
    assert chunk.key_from is None and hi is not None

    assert worker._split(chunk, 0)

    halves = sorted(Chunk.objects.filter(parent=chunk), key=lambda c: c.id)
    assert [h.bounds()[0] for h in halves][0] == lo
    assert halves[0].bounds()[1] == halves[1].bounds()[0]  # they meet at the median key
    assert halves[1].bounds()[1] == hi
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE id < %s::uuid), count(*),"
            " count(*) FILTER (WHERE occurred_at < %s) FROM public.rr_uuid"
            " WHERE tenant_id = %s::int AND id >= %s::uuid AND id < %s::uuid",
            [halves[0].bounds()[1][0], run.cutoff, chunk.tenant, lo[0], hi[0]],
        )
        first_half, keys, eligible = cur.fetchone()
    # planned_rows counts the chunk's keys (young rows too: an upper bound of its deletes);
    # the median is half way through those keys, and the halves share the count
    assert keys == chunk.planned_rows > eligible
    assert first_half == chunk.planned_rows // 2
    assert [h.planned_rows for h in halves] == [keys // 2, keys - keys // 2]


def test_a_chunk_reads_the_targets_column_types_from_the_catalog_once(uuid_policy):
    """Cached per run and version (they cannot change under an approved version without the
    statements failing, and a failure forgets them): at most one catalog lookup per chunk."""
    run, _ = trigger_run(uuid_policy, tick=NOW)
    planner.plan(run, window=3)
    run = Run.objects.select_related("policy_version", "policy").get(pk=run.pk)
    P.forget_types(worker.types_token(run))  # what planning read is cached for the run too
    with CaptureQueriesContext(connection) as queries:
        outcome = worker.process_one(run)
    assert outcome.kind == worker.DONE
    lookups = [q for q in queries.captured_queries if "pg_catalog.pg_attribute a JOIN" in q["sql"]]
    assert len(lookups) == 1


def test_a_runs_catalog_facts_stay_together_whatever_other_runs_the_process_cached():
    """A worker process keeps the catalog facts of the runs it served lately. However many
    facts of other runs it holds when a run's chunk reads its own, the run's next chunk finds
    every one of them (none is read again inside its transaction): a run's facts are let go
    whole, only after ``_MAX_SCOPES`` other runs entered theirs since."""
    names = [("types",), ("cascades",), ("self_blocking",), ("deferred_refs",), ("trigger",)]
    for others in range(0, 6 * P._MAX_SCOPES, 5):  # facts of other runs, four a run
        for i in range(others):
            with P.cached_types(("another run", others, i // 4)):
                P.scoped(("fact", i % 4), lambda: None)
        reads = []
        token = ("run", others)
        for _chunk in range(3):
            with P.cached_types(token):
                for name in names:
                    P.scoped(name, lambda name=name, reads=reads: reads.append(name))
        assert reads == names, (others, reads)

    for i in range(P._MAX_SCOPES):  # as many other runs since: the run's facts are let go
        with P.cached_types(("another run", "after", i)):
            P.scoped(("fact",), lambda: None)
    with P.cached_types(token):
        P.scoped(names[0], lambda: reads.append(names[0]))
        assert reads == [*names, names[0]]
        P.forget_types(token)  # a failed chunk: the next statement reads the catalog afresh
        P.scoped(names[0], lambda: reads.append(names[0]))
    assert reads == [*names, names[0], names[0]]


@pytest.mark.django_db(transaction=True)
def test_engine_sessions_pin_the_settings_that_shape_a_key_bound_text():
    """A chunk's bounds are PostgreSQL's text of the key values, read back on a later attempt,
    maybe by another process: a database or role default for DateStyle, IntervalStyle,
    extra_float_digits or bytea_output must not change how a bound is written or read."""
    from django.db import connections

    with connection.cursor() as cur:
        cur.execute("SELECT current_database()")
        name = cur.fetchone()[0]
        for setting, value in [
            ("DateStyle", "'SQL, DMY'"),
            ("IntervalStyle", "'sql_standard'"),
            ("extra_float_digits", "0"),
            ("bytea_output", "'escape'"),
        ]:
            cur.execute(f'ALTER DATABASE "{name}" SET {setting} = {value}')
    fresh = connections.create_connection("default")
    try:
        with fresh.cursor() as cur:
            cur.execute(
                "SELECT current_setting('DateStyle'), current_setting('IntervalStyle'),"
                " current_setting('extra_float_digits'), current_setting('bytea_output'),"
                " (timestamptz '2026-01-02 03:04:05.123456+00')::text, (0.1::float8)::text"
            )
            assert cur.fetchone() == (
                "ISO, MDY",
                "postgres",
                "1",
                "hex",
                "2026-01-02 03:04:05.123456+00",
                "0.1",
            )
    finally:
        fresh.close()
        with connection.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{name}" RESET ALL')


def test_the_products_sessions_do_not_compile_statements_just_in_time(db):
    """A verification's correlated subplan can estimate past jit_above_cost on a small table:
    compiling then took most of its time (config/settings.py), so the product's sessions run
    without JIT whatever the server's default."""
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('jit')")
        assert cur.fetchone()[0] == "off"
