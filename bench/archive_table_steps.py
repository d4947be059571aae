"""Where an archive table's chunk transaction spends its time on the destination: each step
timed on the bench server for 5,000 rows into a table of 450,000, twelve chunks, medians
(``.venv/bin/python -m bench.archive_table_steps``; docs/performance.md)."""

from __future__ import annotations

import io
import statistics
import time

import psycopg

from bench.common import BENCH_DB, server_url, with_database

N, CHUNKS = 5000, 12
TABLE = "public.rr_dest_steps"
ROWS = (
    "SELECT g, g % 50, now() - make_interval(secs => g), 'k' || (g % 7), repeat(md5(g::text), 2)"
    " FROM generate_series({lo}, {hi}) g"
)


def main() -> None:
    url = with_database(server_url(), BENCH_DB)
    times: dict[str, list[float]] = {}
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        c.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, tenant_id int,"
            " occurred_at timestamptz, kind text, payload text)"
        )
        c.execute(f"INSERT INTO {TABLE} " + ROWS.format(lo=1, hi=450_000))
        c.execute(f"ANALYZE {TABLE}")

        def step(name, fn) -> None:
            t0 = time.perf_counter()
            fn()
            times.setdefault(name, []).append((time.perf_counter() - t0) * 1000)

        def copy_in(data: bytes) -> None:
            with c.cursor().copy("COPY rr_t FROM STDIN") as cp:
                cp.write(data)

        try:
            for i in range(CHUNKS):
                lo = 1_000_000 + i * N
                buf = io.BytesIO()
                query = f"COPY ({ROWS.format(lo=lo, hi=lo + N - 1)}) TO STDOUT"
                with c.cursor().copy(query) as out:
                    for block in out:
                        buf.write(block)
                step("BEGIN, settings", lambda: (
                    c.execute("BEGIN"),
                    c.execute(
                        "SELECT set_config('synchronous_commit', 'on', true),"
                        " set_config('enable_hashjoin', 'off', true),"
                        " set_config('enable_mergejoin', 'off', true)"
                    ),
                ))  # fmt: skip
                step("CREATE TEMP TABLE", lambda: c.execute(
                    "CREATE TEMP TABLE rr_t ON COMMIT DROP AS SELECT id, tenant_id, occurred_at,"
                    f" kind, payload FROM {TABLE} WITH NO DATA"
                ))  # fmt: skip
                data = buf.getvalue()
                step("COPY into the temporary table", lambda data=data: copy_in(data))
                step("INSERT … ON CONFLICT (id) DO NOTHING", lambda: c.execute(
                    f"INSERT INTO {TABLE} SELECT * FROM rr_t ON CONFLICT (id) DO NOTHING"
                ))  # fmt: skip
                step("read back (EXISTS by the key's index)", lambda: c.execute(
                    "SELECT count(*) FROM rr_t r WHERE EXISTS"
                    f" (SELECT 1 FROM {TABLE} d WHERE d.id = r.id)"
                ).fetchone())  # fmt: skip
                step("COMMIT (synchronous)", lambda: c.execute("COMMIT"))
        finally:
            c.execute(f"DROP TABLE IF EXISTS {TABLE}")
    total = 0.0
    print("| step | median ms | min ms |\n|---|--:|--:|")
    for name, ts in times.items():
        total += statistics.median(ts)
        print(f"| {name} | {statistics.median(ts):.1f} | {min(ts):.1f} |")
    print(f"| sum of the medians | {total:.1f} | |")


if __name__ == "__main__":
    main()
