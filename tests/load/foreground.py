"""A foreground client: a fixed-rate, open-loop mix of indexed reads and inserts against a table.

    python tests/load/foreground.py DSN TABLE SECONDS RATE

Latency is measured from each request's scheduled start, so a stall counts in full.
Prints one JSON object: count, p50, p95, p99, max (milliseconds).
"""

from __future__ import annotations

import json
import random
import sys
import time

import psycopg


def main() -> None:
    dsn, table, seconds, rate = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    conn = psycopg.connect(dsn, autocommit=True, application_name="foreground-load")
    ident = psycopg.sql.Identifier("public", table)
    lo, hi = conn.execute(
        psycopg.sql.SQL("SELECT min(id), max(id) FROM {}").format(ident)
    ).fetchone()
    read = psycopg.sql.SQL("SELECT * FROM {} WHERE id = %s").format(ident)
    write = psycopg.sql.SQL(
        "INSERT INTO {} (id, tenant_id, occurred_at, status, payload) VALUES (%s, 3, now(), 'open', 'fg')"
    ).format(ident)
    next_id = hi + 1_000_000
    interval = 1.0 / rate
    start = time.perf_counter()
    latencies = []
    n = 0
    while True:
        scheduled = start + n * interval
        if scheduled - start > seconds:
            break
        now = time.perf_counter()
        if now < scheduled:
            time.sleep(scheduled - now)
        if n % 5 == 0:
            conn.execute(write, [next_id])
            next_id += 1
        else:
            conn.execute(read, [random.randint(lo, hi)]).fetchall()
        latencies.append((time.perf_counter() - scheduled) * 1000)
        n += 1
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 2)

    print(
        json.dumps(
            {
                "count": len(latencies),
                "p50": pct(0.5),
                "p95": pct(0.95),
                "p99": pct(0.99),
                "max": round(latencies[-1], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
