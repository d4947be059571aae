"""The planner's walk: it reads the key index only (never the heap the DELETE reads), plans a
window of chunks in one transaction, and a chunk's ``planned_rows`` is the number of keys in its
range when it was planned — an upper bound of what it can delete; the DELETE decides."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, connections
from psycopg import sql

from retention import predicate as P
from retention.catalog import ColumnType
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import Shadow, check_run
from runs.models import Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events


@pytest.fixture(autouse=True)
def guard_off(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}


def _capture(monkeypatch, fn):
    """Run ``fn()``; return every statement it sent, in order, with a ``COMMIT`` marker where a
    transaction committed."""
    seen: list[tuple[str, list]] = []

    def wrapper(execute, text, params, many, context):
        seen.append((text, params))
        return execute(text, params, many, context)

    wrapped = connections["default"]
    commit = wrapped.commit

    def commit_marked():
        seen.append(("COMMIT", []))
        return commit()

    monkeypatch.setattr(wrapped, "commit", commit_marked)
    with connection.execute_wrapper(wrapper):
        fn()
    monkeypatch.undo()
    return seen


def _scans(plan: dict, relation: str) -> list[dict]:
    """The plan nodes that read ``relation``."""
    found = [plan] if plan.get("Relation Name") == relation else []
    for child in plan.get("Plans", []):
        found += _scans(child, relation)
    return found


def _explain(text: str, params) -> dict:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params)
        return cur.fetchone()[0][0]["Plan"]


@pytest.mark.django_db(transaction=True)  # VACUUM sets the visibility map outside a transaction
@pytest.mark.parametrize("chunking", ["tenant", "key"])
def test_the_walk_reads_the_key_index_only_never_the_heap(make_user, monkeypatch, chunking):
    create_events(20_000)
    with connection.cursor() as cur:
        cur.execute("VACUUM (ANALYZE) public.rr_events")
    try:
        policy = approved_policy(make_user, **events_spec(chunking=chunking))
        run, _ = trigger_run(policy, tick=NOW)
        planner.plan(run, window=1)  # the cursors (first and last eligible key) exist now
        statements = _capture(monkeypatch, lambda: planner.plan(run, window=12))
        on_target = [(t, p) for t, p in statements if "rr_events" in t]
        assert on_target, statements
        for text, params in on_target:
            scans = _scans(_explain(text, params), "rr_events")
            assert scans, text
            for node in scans:
                assert node["Node Type"] == "Index Only Scan", (text, node["Node Type"])
                assert node["Heap Fetches"] == 0, (text, node)
        assert Chunk.objects.filter(run=run).count() == 12
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


@pytest.mark.parametrize("chunking", ["key", "tenant"])
def test_a_window_of_chunks_is_planned_in_one_transaction(events, make_user, monkeypatch, chunking):
    policy = approved_policy(make_user, **events_spec(chunking=chunking))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=1)
    statements = _capture(monkeypatch, lambda: planner.plan(run, window=6))
    assert Chunk.objects.filter(run=run).count() == 6

    def where(pred):
        return [i for i, (text, _) in enumerate(statements) if pred(text)]

    locks = where(lambda t: "runs_plannercursor" in t and "FOR UPDATE SKIP LOCKED" in t)
    inserts = where(lambda t: t.startswith("INSERT INTO") and "runs_chunk" in t)
    updates = where(lambda t: t.startswith("UPDATE") and "runs_plannercursor" in t)
    walks = where(lambda t: "rr_events" in t)
    commits = where(lambda t: t == "COMMIT")
    assert (len(locks), len(inserts), len(updates)) == (1, 1, 1), statements
    cursors = 1 if chunking == "key" else 5  # tenants 1–5 of the events table
    assert 1 <= len(walks) <= cursors
    # lock, walks, insert and cursor update are one transaction: no commit between them
    first, last = locks[0], updates[0]
    assert first < min(walks) and max(walks) < inserts[0] < last
    assert not [c for c in commits if first < c < last]


def _keys_in(chunk: Chunk, per_tenant: bool) -> tuple[int, int]:
    """(keys in the chunk's range, eligible rows among them) on the events table now."""
    lo, hi = chunk.key_from, chunk.key_to
    where = "id >= %s AND (%s::bigint IS NULL OR id < %s)"
    params: list = [lo, hi, hi]
    if per_tenant:
        where += " AND tenant_id = %s::int"
        params.append(chunk.tenant)
    query = (
        f"SELECT count(*), count(*) FILTER (WHERE occurred_at < %s AND status IS DISTINCT FROM"
        f" 'disputed') FROM public.rr_events WHERE {where}"
    )
    with connection.cursor() as cur:
        cur.execute(query, [chunk.run.cutoff, *params])
        return cur.fetchone()


@pytest.mark.parametrize("chunking", ["key", "tenant"])
def test_planned_rows_are_the_keys_in_the_chunks_range_an_upper_bound_of_its_deletes(
    events, make_user, chunking
):
    """The walk counts keys, not eligible rows: kept ('disputed') rows inside a chunk's range
    are in its planned size, and the DELETE — the full predicate — leaves them."""
    policy = approved_policy(make_user, **events_spec(chunking=chunking))
    run, _ = trigger_run(policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    chunks = list(Chunk.objects.filter(run=run).select_related("run").order_by("tenant", "seq"))
    assert chunks
    per_tenant = chunking == "tenant"
    kept_inside = 0
    for c in chunks:
        keys, eligible = _keys_in(c, per_tenant)
        assert c.planned_rows == keys > 0, c
        assert eligible <= c.planned_rows
        kept_inside += keys - eligible
    assert kept_inside > 0  # the test proves something: planned is more than eligible
    assert sum(c.planned_rows for c in chunks) > run.expected_rows
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=Shadow("public", "rr_events_shadow")) == []


def _dup_table(key_type: str) -> None:
    """``public.rr_dup``: a non-unique key; its first value on 13 rows (more than a chunk of 10),
    the second on 40 (more than a window of three chunks), then 57 values on a row each."""
    values = [1] * 13 + [2] * 40 + list(range(3, 60))
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_dup, public.rr_dup_shadow")
        cur.execute(
            sql.SQL(
                "CREATE TABLE public.rr_dup (id {} NOT NULL, occurred_at timestamptz NOT NULL)"
            ).format(sql.SQL(key_type))
        )
        as_key = (lambda v: f"k{v:03d}") if key_type == "text" else (lambda v: v)
        cur.executemany(
            "INSERT INTO public.rr_dup VALUES (%s, %s)",
            [(as_key(v), NOW.replace(year=2025)) for v in values],
        )
        cur.execute("CREATE INDEX ON public.rr_dup (id)")
        cur.execute("CREATE TABLE public.rr_dup_shadow AS SELECT * FROM public.rr_dup")
        cur.execute("ANALYZE public.rr_dup")


@pytest.mark.parametrize("key_type", ["bigint", "text"])
def test_a_key_value_on_more_rows_than_a_window_is_one_chunk_and_the_walk_goes_on(
    db, make_user, key_type
):
    _dup_table(key_type)
    policy = approved_policy(
        make_user, slug="dups", table="public.rr_dup", key="id", timestamp="occurred_at",
        retention="10 days", schedule="0 3 * * *", chunk_size=10,
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=3)
        Chunk.objects.filter(run=run).update(state=Chunk.State.CANCELLED)  # make room
    chunks = list(Chunk.objects.filter(run=run).order_by("seq"))
    assert [c.planned_rows for c in chunks][:2] == [13, 40]  # every row of the value at once
    assert all(c.planned_rows > 0 for c in chunks)
    assert sum(c.planned_rows for c in chunks) == count("public.rr_dup")
    for a, b in zip(chunks, chunks[1:], strict=False):  # contiguous, never overlapping
        assert a.bounds()[1] == b.bounds()[0]
    Chunk.objects.filter(run=run).update(state=Chunk.State.PENDING)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_dup") == 0
    assert check_run(run, shadow=Shadow("public", "rr_dup_shadow")) == []


def _ordered_uuid_table() -> None:
    """``public.rr_uuid7``: a uuid key that follows insertion time (as uuid v7 does), ages
    falling with the key: the young rows are the top of the key range, as in a real table."""
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_uuid7, public.rr_uuid7_shadow")
        cur.execute(
            "CREATE TABLE public.rr_uuid7 (id uuid PRIMARY KEY, occurred_at timestamptz NOT NULL)"
        )
        cur.execute(
            "INSERT INTO public.rr_uuid7 SELECT lpad(to_hex(g * 7919), 32, '0')::uuid,"
            " %s::timestamptz - make_interval(hours => 600 - g)"
            " FROM generate_series(1, 500) AS g",
            [NOW],
        )
        cur.execute("CREATE TABLE public.rr_uuid7_shadow AS SELECT * FROM public.rr_uuid7")
        cur.execute("ANALYZE public.rr_uuid7")


@pytest.mark.django_db
def test_the_last_chunk_of_a_uuid_walk_ends_just_past_the_last_eligible_key(make_user):
    """Not "to the end of the key range": that chunk's DELETE would read every young row
    above it (the top of a time-ordered key) to delete none of them."""
    _ordered_uuid_table()
    policy = approved_policy(
        make_user, slug="uuid7", table="public.rr_uuid7", key="id", timestamp="occurred_at",
        tenant=None, retention="10 days", schedule="0 3 * * *", chunk_size=40, chunking="key",
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id::text FROM public.rr_uuid7 WHERE occurred_at < %s ORDER BY id DESC LIMIT 1",
            [run.cutoff],
        )
        (last,) = cur.fetchone()
        cur.execute("SELECT count(*) FROM public.rr_uuid7 WHERE occurred_at >= %s", [run.cutoff])
        (young,) = cur.fetchone()
    assert young > 100  # the test proves something: many young rows lie above the last chunk
    final = Chunk.objects.filter(run=run).order_by("-seq").first()
    assert final.hi == [str(uuid.UUID(int=uuid.UUID(last).int + 1))]
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=Shadow("public", "rr_uuid7_shadow")) == []
    assert count("public.rr_uuid7") == young


def _type(base: str) -> ColumnType:
    return ColumnType("pg_catalog", base, base, None, True)


@pytest.mark.parametrize(
    ("types", "value", "after"),
    [
        ({"id": "int8"}, ("41",), ("42",)),
        ({"id": "int4"}, (str(2**63 - 1),), None),  # compared as bigint: nothing above
        ({"id": "uuid"}, ("00000000-0000-0000-0000-0000000000ff",),
         ("00000000-0000-0000-0000-000000000100",)),
        ({"id": "uuid"}, ("ffffffff-ffff-ffff-ffff-ffffffffffff",), None),
        ({"tenant_id": "int4", "id": "uuid"}, ("7", "0000000a-0000-0000-0000-00000000ffff"),
         ("7", "0000000a-0000-0000-0000-000000010000")),
        ({"id": "text"}, ("k041",), None),  # no successor in a collation: to the end
        ({"id": "numeric"}, ("4.1",), None),
    ],
)  # fmt: skip
def test_a_key_value_has_a_successor_where_its_type_has_one(types, value, after):
    spec = PolicySpec.parse(
        {
            "slug": "s",
            "table": "public.t",
            "key": list(types) if len(types) > 1 else "id",
            "timestamp": "occurred_at",
            "retention": "10 days",
            "schedule": "0 3 * * *",
        }
    )
    assert P.successor(spec, value, {k: _type(v) for k, v in types.items()}) == after
