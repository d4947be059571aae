"""The hand-written contenders, each in its own process (``python -m bench.loops SPEC_JSON``):

- ``single``: one ``DELETE … WHERE occurred_at < cutoff`` — the physical ceiling;
- ``naive``: ``DELETE … WHERE id IN (SELECT id … WHERE occurred_at < cutoff LIMIT n)`` until
  nothing is left — the loop most people write first;
- ``keyrange``: a hand-tuned key-range loop. On a single integer key: find the key range of
  eligible rows once, then delete ``[k, k + n)`` slices of it in key order,
  ``AND occurred_at < cutoff``. On any other key (uuid, composite): walk the primary-key btree,
  ``n`` entries at a time — the slice's upper key by an index-only ``OFFSET n - 1``, then
  ``DELETE … WHERE (key) > (previous) AND (key) <= (upper) AND occurred_at < cutoff`` with
  row comparisons (pt-archiver's way); both statements count as the slice's time.

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
    pk = spec.get("pk", ["id"])
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in pk)
    row = sql.SQL("({})").format(cols)
    marks = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(pk)))

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
            "DELETE FROM {t} WHERE {row} IN (SELECT {cols} FROM {t} WHERE occurred_at < %s LIMIT %s)"
        ).format(t=tbl, row=row, cols=cols)
        while timed(query, [cutoff, n]) > 0:
            if deadline and time.monotonic() > deadline:
                capped = True
                break
    elif kind == "keyrange" and spec.get("int_key", True):
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
    elif kind == "keyrange":
        after = sql.SQL("WHERE {} > {}").format(row, marks)
        upper_q = sql.SQL("SELECT {cols} FROM {t} {w} ORDER BY {cols} OFFSET %s LIMIT 1")
        delete_q = sql.SQL("DELETE FROM {t} {w} {upto} occurred_at < %s")
        pos = None
        while True:
            t0, m0 = time.time(), time.monotonic()
            where = after if pos is not None else sql.SQL("")
            upper = conn.execute(
                upper_q.format(cols=cols, t=tbl, w=where), [*(pos or ()), n - 1]
            ).fetchone()
            upto = sql.SQL("{} {} <= {} AND").format(
                sql.SQL("AND" if pos is not None else "WHERE"), row, marks
            )
            if upper is None:  # the last, partial slice
                upto = sql.SQL("AND" if pos is not None else "WHERE")
            params = [*(pos or ()), *(upper or ()), cutoff]
            cur = conn.execute(delete_q.format(t=tbl, w=where, upto=upto), params)
            chunks.append((t0, time.monotonic() - m0, cur.rowcount))
            if upper is None:
                break
            pos = tuple(upper)
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
