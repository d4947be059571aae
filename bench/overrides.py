"""A chunk's DELETE with thousands of per-tenant overrides against the same chunk with none
(``python -m bench.overrides [--rows N] [--tenants N] [--overrides N] [--repeat N]``).

Its own database (``retention_bench_overrides`` on the bench server, ``bench/common.py``),
migrated on first use. ``bench.tenant_events``: ``--rows`` rows over 40 days, ids in time
order, ``--tenants`` text tenants interleaved, an index on (tenant, id). The policy deletes
rows older than 20 days by key-range chunks; its second version adds ``--overrides`` tenants
the table does not hold, each kept
"7 years" (``--period``): every row of a chunk is younger than that, so each is looked up among
the overrides (and found in none) and still goes — both versions delete the same rows
(``--chunk``: 5,000 a chunk, all older than 30 days). Each chunk's DELETE
(``retention.predicate.delete_chunk``, holds and all, built inside the timing, as a worker
builds it: rows counted per tenant for a chunk across tenants, the catalog's types read once) runs first in a
transaction rolled back, then again committed (what a chunk costs: the WAL flush too), the two
versions alternating on the same key ranges of two identical copies (``bench.tenant_events``,
``bench.tenant_events_o``), each version on each copy in turn; prints the median and p90 of each, their ratio,
the CPU time a chunk took (this process's and its server backend's, per chunk: on a busy
machine the wall time is mostly waiting for a core) and the plan of the overridden one. Nothing is timed in tests; this prints.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, percentile, server_url, with_database  # noqa: E402

DB = "retention_bench_overrides"
TICK = datetime(2026, 11, 30, 12, tzinfo=UTC)


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


def build(url: str, rows: int, tenants: int) -> None:
    """Two identical copies, one per version, so each deletes the same rows for real."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        for name in ("tenant_events", "tenant_events_o"):
            conn.execute(f"DROP TABLE IF EXISTS bench.{name}")
            conn.execute(
                f"CREATE TABLE bench.{name} (id bigint PRIMARY KEY, tenant text NOT NULL,"
                " occurred_at timestamptz NOT NULL, payload text)"
            )
            conn.execute(
                f"INSERT INTO bench.{name} SELECT g, 't' || lpad((g %% %s)::text, 6, '0'),"
                " %s::timestamptz - make_interval(secs => 40 * 86400.0 * (1 - g::float8 / %s)),"
                " repeat('x', 60) FROM generate_series(1, %s) AS g",
                [tenants, TICK, rows, rows],
            )
            conn.execute(f"CREATE INDEX ON bench.{name} (tenant, id)")
            conn.execute(f"CREATE INDEX ON bench.{name} (occurred_at)")
            conn.execute(f"VACUUM ANALYZE bench.{name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--overrides", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--passes", type=int, default=4, help="rolled back: passes over them")
    parser.add_argument("--period", default="7 years", help="each override's period")
    parser.add_argument(
        "--tenant-chunks", action="store_true",
        help="chunks of one tenant each (chunking = \"tenant\"): use with few --tenants",
    )  # fmt: skip
    args = parser.parse_args()
    url = prepare()
    build(url, args.rows, args.tenants)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("RETENTION_DEMO", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from retention import predicate as P
    from retention.spec import PolicySpec
    from runs.engine.explain import _plan

    base = dict(
        slug="bench-overrides", table="bench.tenant_events", key="id", timestamp="occurred_at",
        tenant="tenant", retention="20 days", schedule="0 3 * * *", chunking="key",
    )  # fmt: skip
    # tenants the table does not hold, kept for years: every row of a chunk is looked up
    # among the overrides (and found in none), so both versions delete the same rows
    names = [f"x{n:06d}" for n in range(args.overrides)]
    # each version on each of the two identical copies: a chunk's two versions run on
    # different copies, and which copy takes which version alternates, so neither version is
    # timed on one copy's pages alone (two copies built one after the other differ by more
    # than the overrides cost, on a busy machine)
    specs = {
        (label, name): PolicySpec.parse(
            {**base, "table": f"bench.{name}",
             **({"override": [{"tenant": names, "retention": args.period}]} if label else {})}
        )
        for label in ("", "overrides")
        for name in ("tenant_events", "tenant_events_o")
    }  # fmt: skip
    plain = specs[("", "tenant_events")]
    overridden = specs[("overrides", "tenant_events_o")]
    over = f"{args.overrides} overrides"
    cutoff = plain.cutoff_for(TICK)
    # chunks in the oldest part of the table (every row older than 30 days)
    ranges = [(None, 1 + i * args.chunk, 1 + (i + 1) * args.chunk) for i in range(args.repeat + 1)]
    if args.tenant_chunks:  # one tenant's first --chunk rows each (ids interleave tenants)
        span = 1 + args.chunk * args.tenants
        ranges = [(f"t{n:06d}", 1, span) for n in range(args.repeat + 1)]

    connection.ensure_connection()
    backend = f"/proc/{connection.connection.info.backend_pid}/schedstat"

    def cpu() -> float:
        """CPU seconds of this process and of its server backend: what a chunk costs whatever
        else the machine runs (its wall time on a busy machine is mostly waiting for a core).
        The backend's from the scheduler's own count, in nanoseconds (``/proc/PID/stat`` counts
        ticks of 10 ms: a chunk takes less than one, and 30 chunks' sum was off by a tenth)."""
        with open(backend) as f:
            return time.process_time() + int(f.read().split()[0]) / 1e9

    def run(spec, tenant, lo, hi, *, commit: bool) -> tuple[float, int]:
        """The chunk's DELETE (holds, keep rules, periods: the engine's statement) and its
        commit, or the DELETE alone rolled back; the statement built inside the timing."""
        t0 = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cur:
            frag = P.delete_chunk(
                spec, policy_id=0, cutoff=cutoff, tenant=tenant, key_from=lo, key_to=hi,
                by_tenant=tenant is None,
            )  # fmt: skip
            cur.execute(frag.sql, frag.params)
            n = cur.rowcount
            transaction.set_rollback(not commit)
        return (time.perf_counter() - t0) * 1000, n

    results = {}
    for commit, scope in ((False, 1), (True, 2)):  # a worker's scope: its catalog types once
        times: dict[str, list[float]] = {"none": [], over: []}
        deleted: dict[str, set] = {k: set() for k in times}
        spent = dict.fromkeys(times, 0.0)
        # rolled back, the same ranges again --passes times (CPU time is counted in ticks)
        chunks = ranges[:-1] * (1 if commit else args.passes)
        with P.cached_types(("bench", scope)):
            for spec in specs.values():  # warm all (a range deleted for real: not reused)
                run(spec, *ranges[-1], commit=False)
            for i, (tenant, lo, hi) in enumerate(chunks):
                # which runs first alternates every chunk, which copy each takes every second
                copies = ("tenant_events", "tenant_events_o")[:: 1 if i // 2 % 2 == 0 else -1]
                order = [
                    ("none", specs[("", copies[0])]),
                    (over, specs[("overrides", copies[1])]),
                ]
                for label, spec in order if i % 2 == 0 else order[::-1]:
                    c0 = cpu()
                    took, n = run(spec, tenant, lo, hi, commit=commit)
                    spent[label] += cpu() - c0
                    times[label].append(took)
                    deleted[label].add(n)
        cpu_ms = {k: spent[k] * 1000 / len(chunks) for k in spent}
        results["chunk: DELETE + COMMIT" if commit else "statement, rolled back"] = (
            times, deleted, cpu_ms
        )  # fmt: skip
    print(
        f"chunk of {args.chunk} rows by {'tenant and ' if args.tenant_chunks else ''}key range,"
        f" {args.rows} rows / {args.tenants} tenants,"
        f" {args.repeat} chunks each ({args.passes} passes rolled back), the two versions"
        f" alternating; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        f"{'what':<26}{'version':<18}{'rows':>6}{'median ms':>11}{'p90 ms':>9}{'ratio':>7}"
        f"{'CPU ms':>8}{'ratio':>7}"
    )
    for what, (times, deleted, cpu_ms) in results.items():
        base_ms = statistics.median(times["none"])
        for label, values in times.items():
            median = statistics.median(values)
            print(
                f"{what:<26}{label:<18}{'/'.join(map(str, sorted(deleted[label]))):>6}"
                f"{median:>11.1f}{percentile(values, 90):>9.1f}{median / base_ms:>7.2f}"
                f"{cpu_ms[label]:>8.2f}{cpu_ms[label] / cpu_ms['none']:>7.2f}"
            )
    frag = P.delete_chunk(
        overridden, policy_id=0, cutoff=cutoff, tenant=ranges[-1][0], key_from=ranges[-1][1],
        key_to=ranges[-1][2], by_tenant=ranges[-1][0] is None,
    )  # fmt: skip
    # the plan, its array of tenants cut short
    print("\n".join(re.sub(r"'\{([^}]{60})[^}]*\}'", r"'{\1…}'", line) for line in _plan(frag)))


if __name__ == "__main__":
    main()
