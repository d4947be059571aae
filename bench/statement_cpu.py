"""What a chunk's DELETE costs the server, piece by piece, against the key-range loop's
(``python -m bench.statement_cpu [--shape NAME] [--rows N] [--slice N]``).

On a fresh copy of one shape's table (``bench/dataset.py``; an integer key), consecutive key
slices of ``--slice`` keys each go, in turns, to one statement of the list below, each in a
transaction of its own that commits, so each statement deletes its own rows for real:

- the loop's ``DELETE … WHERE id >= a AND id < b AND occurred_at < cutoff`` (``bench/loops.py``);
- the same with the legal-hold anti-join the product's chunks carry (a top-level correlated
  ``NOT EXISTS`` against an empty table of the hold table's columns, ``bench.stub_holds``);
- the loop's DELETE ``RETURNING 1``: PostgreSQL fetches each deleted row again for any
  ``RETURNING``;
- ``RETURNING tenant_id`` grouped per tenant in a CTE, as a chunk across tenants counts its
  rows for the audit record (``retention.predicate.delete_chunk``, ``by_tenant``);
- all of them together: the product's chunk statement on a policy naming the tenant;
- the loop's and the product's statements with the index scan turned off
  (``enable_indexscan = off``): a bitmap heap scan over the slice.

For each it prints the median backend CPU per slice (``/proc/PID/schedstat`` of the
connection's backend: the server must run on this machine, as the embedded one does) and its
ratio to the loop's, and the median wall time. On a busy machine the wall time is mostly
waiting for a core; the CPU is the figure to read. Nothing is timed in tests; this prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime

import psycopg
from psycopg import sql

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import dataset  # noqa: E402
from bench.common import BENCH_DB, SCHEMA, server_url, with_database  # noqa: E402

TICK = datetime(2026, 12, 7, tzinfo=UTC)
BITMAP = "SET LOCAL enable_indexscan = off"


def statements(table: sql.Composable) -> dict[str, tuple[str, sql.Composable]]:
    """Name → (a setting for its transaction or "", the statement); ``%s`` are the slice's
    bounds and the cutoff."""
    delete = sql.SQL("DELETE FROM {} AS t WHERE t.id >= %s AND t.id < %s AND t.occurred_at < %s")
    delete = delete.format(table)
    hold = sql.SQL(
        " AND NOT EXISTS (SELECT 1 FROM {} AS h WHERE h.released_at IS NULL"
        " AND (h.policy_id IS NULL OR h.policy_id = 1)"
        " AND (h.tenant IS NULL OR t.tenant_id = h.tenant::integer)"
        " AND (h.key_from IS NULL OR t.id >= h.key_from) AND (h.key_to IS NULL OR t.id < h.key_to))"
    ).format(sql.Identifier(SCHEMA, "stub_holds"))

    def grouped(inner: sql.Composable) -> sql.Composable:
        return sql.SQL(
            "WITH d AS ({} RETURNING t.tenant_id) SELECT d.tenant_id::text, count(*) FROM d"
            " GROUP BY d.tenant_id"
        ).format(inner)

    product = grouped(sql.SQL("{}{}").format(delete, hold))
    return {
        "the loop's DELETE": ("", delete),
        "+ the legal-hold anti-join": ("", sql.SQL("{}{}").format(delete, hold)),
        "the loop's DELETE RETURNING 1": ("", sql.SQL("{} RETURNING 1").format(delete)),
        "RETURNING tenant_id, grouped": ("", grouped(delete)),
        "the product's chunk statement": ("", product),
        "the loop's DELETE, bitmap scan": (BITMAP, delete),
        "the product's statement, bitmap scan": (BITMAP, product),
    }


def backend_cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="interleaved-random-tenant")
    parser.add_argument("--rows", default="1M")
    parser.add_argument("--slice", type=int, default=10_000, help="keys per statement")
    args = parser.parse_args()
    shape = dataset.shape_of(args.shape)
    if not shape.int_key:
        raise SystemExit(f"{shape.name}: the loop's slices need a single integer key")
    rows = dataset.parse_size(args.rows)
    cutoff = dataset.cutoff_for(TICK)
    url = with_database(server_url(), BENCH_DB)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, released_at timestamptz,"
                " policy_id bigint, tenant text, key_from bigint, key_to bigint)"
            ).format(sql.Identifier(SCHEMA, "stub_holds"))
        )
        facts = dataset.create_template(conn, rows, shape.name, TICK)
        name = dataset.copy_name(shape.name, "statement-cpu")
        dataset.make_copy(conn, facts["table"], shape.name, name)
        table = sql.Identifier(SCHEMA, name)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        todo = statements(table)
        cpu: dict[str, list[float]] = {k: [] for k in todo}
        wall: dict[str, list[float]] = {k: [] for k in todo}
        names = list(todo)
        for i, lo in enumerate(range(1, rows - args.slice + 2, args.slice)):
            key = names[i % len(names)]
            setting, statement = todo[key]
            c0, t0 = backend_cpu_ms(pid), time.perf_counter()
            with conn.transaction():
                if setting:
                    conn.execute(setting)
                conn.execute(statement, [lo, lo + args.slice, cutoff])
            wall[key].append((time.perf_counter() - t0) * 1000)
            cpu[key].append(backend_cpu_ms(pid) - c0)
        dataset.drop_copy(conn, name)
    loop = statistics.median(cpu[names[0]])
    print(
        f"{shape.name}, {dataset.size_label(rows)} rows, {facts['eligible']:,} eligible;"
        f" slices of {args.slice:,} keys, in turns; load average {os.getloadavg()[0]:.1f}"
    )
    print("| statement | slices | backend CPU ms (median) | × the loop's | wall ms (median) |")
    print("|---|--:|--:|--:|--:|")
    for key in names:
        med = statistics.median(cpu[key])
        print(
            f"| {key} | {len(cpu[key])} | {med:.2f} | {med / loop:.2f} |"
            f" {statistics.median(wall[key]):.1f} |"
        )


if __name__ == "__main__":
    main()
