"""A range-partitioned table: the partition-aware run against the same policy row by row and
against one DELETE — wall time, WAL bytes, dead tuples left behind. Prints a Markdown table.

    .venv/bin/python bench/partitions.py [--rows 1000000] [--only aware,chunks,single]

Database ``retention_bench_parts`` on the embedded server (or ``BENCH_SERVER_URL``'s),
migrated on first use. Each contender gets a fresh ``bench.parts``: 12 monthly partitions
of 2026, ``--rows`` rows spread evenly over the year (bigint ``id`` in time order, no tenant,
indexes on ``id`` and ``occurred_at``, autovacuum off so dead tuples stay countable), then
``VACUUM ANALYZE`` and ``CHECKPOINT``. The policy keeps 169 days before the tick
2026-12-31 00:00 UTC: cutoff 2026-07-15, so January–June are wholly past (half the table's
partitions) and July straddles the cutoff.

- ``aware``: the product — approve (``apply_spec`` → ``submit_version`` → ``approve_version``),
  ``trigger_run``, then ``worker.drain`` in this process (one worker) until the run is
  drained: the six expired partitions are detached concurrently and dropped, July's old rows
  are deleted in chunks;
- ``chunks``: the same policy and engine with the partition step switched off in this process
  (``runs.engine.partitions.settle`` answers "settled" at once): every old row in chunks;
- ``single``: ``DELETE FROM bench.parts WHERE occurred_at < cutoff`` in one transaction.

WAL bytes: ``pg_current_wal_insert_lsn()`` before and after (the ledger's own writes
included for the product). Left behind: ``n_dead_tup`` of the partitions still attached
(after a statistics flush), their dead heap tuples (``pgstattuple``, when available), and
the size of the expired months' partitions that remain.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, server_url, with_database  # noqa: E402

DB = "retention_bench_parts"
TICK = datetime(2026, 12, 31, tzinfo=UTC)
RETENTION = "169 days"
CUTOFF = datetime(2026, 7, 15, tzinfo=UTC)


def prepare() -> str:
    server = server_url()
    url = with_database(server, DB)
    with psycopg.connect(server, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            admin.execute(f'CREATE DATABASE "{DB}"')
    env = dict(os.environ, DATABASE_URL=url, RETENTION_DEMO="1")
    for cmd in (["migrate", "--no-input", "-v", "0"], ["createcachetable"]):
        subprocess.run([sys.executable, "manage.py", *cmd], cwd=ROOT, env=env, check=True)
    return url


def build(conn, rows: int) -> None:
    conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
    conn.execute("DROP TABLE IF EXISTS bench.parts CASCADE")
    for m in range(1, 13):
        conn.execute(f"DROP TABLE IF EXISTS bench.parts_2026_{m:02d}")
    conn.execute(
        "CREATE TABLE bench.parts (id bigint NOT NULL, occurred_at timestamptz NOT NULL,"
        " status text, payload text) PARTITION BY RANGE (occurred_at)"
    )
    for m in range(1, 13):
        hi = "2027-01-01" if m == 12 else f"2026-{m + 1:02d}-01"
        conn.execute(
            f"CREATE TABLE bench.parts_2026_{m:02d} PARTITION OF bench.parts"
            f" FOR VALUES FROM ('2026-{m:02d}-01 00:00+00') TO ('{hi} 00:00+00')"
            f" WITH (autovacuum_enabled = off)"
        )
    conn.execute(
        "INSERT INTO bench.parts SELECT g, '2026-01-01 00:00+00'::timestamptz"
        " + interval '365 days' * ((g - 1)::float8 / %s), 'closed', repeat('x', 80)"
        " FROM generate_series(1, %s) AS g",
        [rows, rows],
    )
    conn.execute("CREATE INDEX ON bench.parts (id)")
    conn.execute("CREATE INDEX ON bench.parts (occurred_at)")
    conn.execute("VACUUM ANALYZE bench.parts")
    conn.execute("CHECKPOINT")


def wal(conn) -> str:
    return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


def leftovers(conn, stattuple: bool) -> dict:
    """What the partitions still attached hold that vacuum must deal with: dead tuples as
    PostgreSQL's statistics count them (``n_dead_tup``, what autovacuum acts on), dead tuples
    still in the heap (``pgstattuple``; page pruning during later scans reclaims some without
    a vacuum), and the bytes of the six expired months' partitions left behind."""
    parts = [
        r[0]
        for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'bench.parts'::regclass"
        ).fetchall()
    ]
    time.sleep(1.0)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    (n_dead,) = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
        " WHERE relid = ANY(%s::regclass[])",
        [parts],
    ).fetchone()
    heap_dead = None
    if stattuple:
        heap_dead = sum(
            conn.execute("SELECT dead_tuple_count FROM pgstattuple(%s)", [p]).fetchone()[0]
            for p in parts
        )
    expired = [f"bench.parts_2026_{m:02d}" for m in range(1, 7)]
    (size,) = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(to_regclass(n))), 0) FROM unnest(%s::text[]) n",
        [expired],
    ).fetchone()
    return {"n_dead": int(n_dead), "heap_dead": heap_dead, "expired_bytes": int(size)}


def flush_stats(cursor_execute) -> None:
    """Make the deleting session report its table statistics now (PostgreSQL 15+)."""
    try:
        cursor_execute("SELECT pg_stat_force_next_flush()")
        cursor_execute("SELECT 1")
    except Exception:  # noqa: BLE001 - older servers: the statistics arrive a little later
        time.sleep(1.0)


def product(slug: str, *, aware: bool) -> dict:
    # the product's modules import only after django.setup() (main)
    from django.contrib.auth.models import Group, User

    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec
    from runs.actions import trigger_run
    from runs.engine import partitions, worker
    from runs.models import AuditRecord, Run

    def user(name):
        u, _ = User.objects.get_or_create(username=name)
        u.groups.add(Group.objects.get_or_create(name="compliance")[0])
        return u

    spec = PolicySpec.parse(
        {
            "slug": slug, "table": "bench.parts", "key": "id", "timestamp": "occurred_at",
            "retention": RETENTION, "schedule": "0 0 * * *", "timezone": "UTC",
            "chunk_size": 5000, "blast_radius": 1000.0,
        }
    )  # fmt: skip
    author, approver = user("bench-author"), user("bench-approver")
    version = actions.apply_spec(spec, author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    if version.state == PolicyVersion.State.SUBMITTED:
        actions.approve_version(version, actor=approver, reason="benchmark")
    policy = Policy.objects.get(slug=slug)
    original = partitions.settle
    if not aware:
        partitions.settle = lambda run, deadline=None: partitions.SETTLED
    try:
        t0 = time.monotonic()
        run, _ = trigger_run(policy, tick=TICK, source="manual", actor="bench")
        assert run.cutoff == CUTOFF, run.cutoff
        while True:
            worker.drain(run.pk, budget_s=600, until_idle=True)
            run.refresh_from_db()
            if run.state != Run.State.ACTIVE:
                break
            time.sleep(0.2)
        seconds = time.monotonic() - t0
    finally:
        partitions.settle = original
    from django.db import connection  # the session that deleted (after django.setup())

    flush_stats(lambda q: connection.cursor().execute(q))
    records = AuditRecord.objects.filter(run=run)
    return {
        "seconds": seconds,
        "state": run.state,
        "rows": sum(records.values_list("rows_deleted", flat=True)),
        "dropped": records.filter(outcome="dropped").count(),
        "chunks": records.filter(outcome="deleted").count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default="aware,chunks,single")
    args = parser.parse_args()
    url = prepare()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("RETENTION_DEMO", "1")
    os.environ.setdefault("RETENTION_GUARD", "0")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    conn = psycopg.connect(url, autocommit=True)
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        stattuple = True
    except psycopg.Error:
        stattuple = False
    version = conn.execute("SHOW server_version").fetchone()[0]
    results = []
    for name in args.only.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {name}: building {args.rows} rows", file=sys.stderr)
        build(conn, args.rows)
        start = wal(conn)
        if name == "single":
            t0 = time.monotonic()
            cur = conn.execute("DELETE FROM bench.parts WHERE occurred_at < %s", [CUTOFF])
            out = {"seconds": time.monotonic() - t0, "rows": cur.rowcount, "dropped": 0,
                   "chunks": 1, "state": "—"}  # fmt: skip
            flush_stats(conn.execute)
        else:
            slug = f"parts-{name}-{int(time.time())}"
            out = product(slug, aware=name == "aware")
        end = wal(conn)
        (wal_bytes,) = conn.execute(
            "SELECT pg_wal_lsn_diff(%s, %s)::bigint", [end, start]
        ).fetchone()
        out.update(name=name, wal=int(wal_bytes), **leftovers(conn, stattuple))
        left = conn.execute(
            "SELECT count(*) FROM bench.parts WHERE occurred_at < %s", [CUTOFF]
        ).fetchone()[0]
        out["left"] = left
        results.append(out)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {out}", file=sys.stderr)
    print(f"\nPostgreSQL {version}, {args.rows:,} rows in 12 monthly partitions, cutoff "
          f"{CUTOFF:%Y-%m-%d} (6 partitions wholly past, 1 straddling); dead tuples by "
          f"{'pgstattuple' if stattuple else 'n_dead_tup'}; one worker\n")  # fmt: skip
    print("| contender | wall s | rows deleted | partitions dropped | chunks | WAL MB | WAL B/row"
          " | dead tuples (n_dead_tup) | dead tuples in heap | expired partitions left |"
          " old rows left |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        per_row = r["wal"] / r["rows"] if r["rows"] else 0
        print(f"| {r['name']} | {r['seconds']:.1f} | {r['rows']:,} | {r['dropped']} | {r['chunks']} |"
              f" {r['wal'] / 2**20:.1f} | {per_row:.0f} | {r['n_dead']:,} |"
              f" {'—' if r['heap_dead'] is None else format(r['heap_dead'], ',')} |"
              f" {r['expired_bytes'] / 2**20:.1f} MB | {r['left']} |")  # fmt: skip


if __name__ == "__main__":
    main()
