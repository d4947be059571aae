"""The hand-written contenders, each in its own process (``python -m bench.loops SPEC_JSON``):

- ``single``: one ``DELETE … WHERE occurred_at < cutoff`` — the physical ceiling;
- ``naive``: ``DELETE … WHERE id IN (SELECT id … WHERE occurred_at < cutoff LIMIT n)`` until
  nothing is left — the loop most people write first;
- ``keyrange``: find the key range of eligible rows once, then delete ``[k, k + n)`` slices
  of it in key order, ``AND occurred_at < cutoff`` — a hand-tuned key-range loop.

Every statement commits on its own (autocommit). The process waits for ``go`` on stdin
so that start-up is not timed, and prints one JSON line: wall times (epoch seconds),
rows, and per-statement (start, seconds, rows).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

import psycopg
from psycopg import sql

from bench.common import SCHEMA, peak_rss_kb


def run(spec: dict) -> dict:
    tbl = sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(spec["table"]))
    cutoff = datetime.fromisoformat(spec["cutoff"])
    n = spec["chunk_size"]
    cap = spec.get("time_cap_s")
    conn = psycopg.connect(spec["dsn"], autocommit=True, application_name="bench-loop")
    if spec.get("synchronous_commit") is False:
        conn.execute("SET synchronous_commit = off")
    chunks: list[tuple[float, float, int]] = []

    def timed(query, params) -> int:
        t0 = time.time()
        m0 = time.monotonic()
        cur = conn.execute(query, params)
        chunks.append((t0, time.monotonic() - m0, cur.rowcount))
        return cur.rowcount

    print("ready", flush=True)
    sys.stdin.readline()
    started = time.time()
    deadline = time.monotonic() + cap if cap else None
    capped = False
    kind = spec["kind"]
    if kind == "single":
        timed(sql.SQL("DELETE FROM {} WHERE occurred_at < %s").format(tbl), [cutoff])
    elif kind == "naive":
        query = sql.SQL(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE occurred_at < %s LIMIT %s)"
        ).format(t=tbl)
        while timed(query, [cutoff, n]) > 0:
            if deadline and time.monotonic() > deadline:
                capped = True
                break
    elif kind == "keyrange":
        lo, hi = conn.execute(
            sql.SQL("SELECT min(id), max(id) FROM {} WHERE occurred_at < %s").format(tbl),
            [cutoff],
        ).fetchone()
        query = sql.SQL("DELETE FROM {} WHERE id >= %s AND id < %s AND occurred_at < %s").format(
            tbl
        )
        key = lo
        while lo is not None and key <= hi:
            timed(query, [key, key + n, cutoff])
            key += n
            if deadline and time.monotonic() > deadline:
                capped = True
                break
    else:
        raise SystemExit(f"unknown loop kind {kind!r}")
    ended = time.time()
    return {
        "started": started,
        "ended": ended,
        "rows": sum(c[2] for c in chunks),
        "chunks": chunks,
        "capped": capped,
        "rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
