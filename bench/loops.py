"""The hand-written contenders, each in its own process (``python -m bench.loops SPEC_JSON``):

- ``single``: one ``DELETE … WHERE occurred_at < cutoff`` — the physical ceiling;
- ``naive``: ``DELETE … WHERE id IN (SELECT id … WHERE occurred_at < cutoff LIMIT n)`` until
  nothing is left — the loop most people write first;
- ``keyrange``: a hand-tuned key-range loop. On a single integer key: find the key range of
  eligible rows once, then delete ``[k, k + n)`` slices of it in key order,
  ``AND occurred_at < cutoff``. On any other key (uuid, composite): walk the primary-key btree,
  ``n`` entries at a time, one statement per slice: the next ``n`` keys after the previous
  slice's last (``WHERE (key) > (last) ORDER BY key LIMIT n``, a row comparison: pt-archiver's
  way), the old ones among them deleted by ``ctid`` (TID scan), the new last key returned. (A range
  ``(key) > (a) AND (key) <= (b) AND occurred_at < cutoff`` lets the planner pick the
  ``occurred_at`` index and filter every eligible row per slice.)
- ``keyrange`` with ``"connections": 2`` (contender ``keyrange-2``): the same loop on two
  connections at once, one thread each — what two parallel streams of DELETEs gain on this
  machine, the ceiling for 2 workers ÷ 1. On a single integer key the two take the slices
  in turns (``[k, k + n)`` to one, the next to the other: adjacent, as two workers take
  adjacent chunks); on any other key each walks half of the key range, from either side of
  the middle key (found before ``go``, by an Index Only Scan: not timed).

- ``copyout`` (single integer key): the hand-written archive loop — per key-range slice, in one
  transaction, ``COPY (SELECT * … slice AND occurred_at < cutoff) TO STDOUT (FORMAT binary)``
  into a file of its own, ``fsync``, then ``DELETE`` the same slice (``archive_dir``).

Every statement commits on its own (autocommit), ``copyout``'s slices in one transaction each. The process waits for ``go`` on stdin
so that start-up is not timed, and prints one JSON line: wall times (epoch seconds),
rows, and per-statement (start, seconds, rows).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from bench.common import SCHEMA, cpu_mark, cpu_spent, peak_rss_kb


def run(spec: dict) -> dict:
    tbl = sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(spec["table"]))
    cutoff = datetime.fromisoformat(spec["cutoff"])
    n = spec["chunk_size"]
    cap = spec.get("time_cap_s")

    def connect() -> psycopg.Connection:
        conn = psycopg.connect(spec["dsn"], autocommit=True, application_name="bench-loop")
        if spec.get("synchronous_commit") is False:
            conn.execute("SET synchronous_commit = off")
        return conn

    streams = spec.get("connections", 1)
    conns = [connect() for _ in range(streams)]
    conn = conns[0]
    chunks: list[tuple[float, float, int]] = []
    pk = spec.get("pk", ["id"])
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in pk)
    row = sql.SQL("({})").format(cols)
    marks = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(pk)))

    def timed(query, params, on=None) -> int:
        t0 = time.time()
        m0 = time.monotonic()
        cur = (on or conn).execute(query, params)
        chunks.append((t0, time.monotonic() - m0, cur.rowcount))
        return cur.rowcount

    kind = spec["kind"]
    int_key = spec.get("int_key", True)
    middle = None
    if kind == "keyrange" and streams > 1 and not int_key:
        middle = conn.execute(
            sql.SQL(
                "SELECT {cols} FROM {t} ORDER BY {cols}"
                " OFFSET (SELECT count(*) / 2 FROM {t}) LIMIT 1"
            ).format(cols=cols, t=tbl)
        ).fetchone()
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = cpu_mark(c.info.backend_pid for c in conns)
    started = time.time()
    deadline = time.monotonic() + cap if cap else None
    capped = False

    def in_parallel(work) -> bool:
        """``work(i, conn)`` on each connection in a thread of its own; True: one was capped."""
        results = [False] * streams

        def one(i: int) -> None:
            results[i] = work(i, conns[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return any(results)

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
    elif kind == "keyrange" and int_key:
        lo, hi = conn.execute(
            sql.SQL("SELECT min(id), max(id) FROM {} WHERE occurred_at < %s").format(tbl),
            [cutoff],
        ).fetchone()
        query = sql.SQL("DELETE FROM {} WHERE id >= %s AND id < %s AND occurred_at < %s").format(
            tbl
        )

        def slices(i: int, on: psycopg.Connection) -> bool:
            if lo is None:  # nothing eligible
                return False
            key = lo + i * n
            while key <= hi:
                timed(query, [key, key + n, cutoff], on)
                key += streams * n
                if deadline and time.monotonic() > deadline:
                    return True
            return False

        capped = in_parallel(slices)
    elif kind == "keyrange":
        # One statement per slice: the next n primary-key entries after the previous slice (a
        # btree walk, ORDER BY key LIMIT n), the old ones among them deleted by their ctid (a
        # TID scan: a join back on the key tempts the planner into a hash join over the whole
        # table), and the slice's last key returned for the next step.
        query = sql.SQL(
            "WITH s AS MATERIALIZED (SELECT ctid AS tid, {cols}, occurred_at < %s AS old FROM {t} {w}"
            "  ORDER BY {cols} LIMIT %s),"
            " d AS (DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT tid FROM s WHERE old)) RETURNING 1)"
            " SELECT (SELECT count(*) FROM d), last.* FROM"
            " (SELECT {cols} FROM s ORDER BY {desc} LIMIT 1) AS last"
        )
        desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in pk)

        def walk(i: int, on: psycopg.Connection) -> bool:
            # one stream: the whole range; two: below the middle key, and from it on
            pos = tuple(middle) if i == 1 else None
            inclusive = i == 1
            below = [sql.SQL("{} < {}").format(row, marks)] if middle is not None and i == 0 else []
            while True:
                above = (
                    [sql.SQL("{} {} {}").format(row, sql.SQL(">=" if inclusive else ">"), marks)]
                    if pos
                    else []
                )
                parts = above + below
                where = sql.SQL("WHERE ") + sql.SQL(" AND ").join(parts) if parts else sql.SQL("")
                params = [*(pos or ()), *(middle if below else ())]
                t0, m0 = time.time(), time.monotonic()
                got = on.execute(
                    query.format(cols=cols, t=tbl, w=where, row=row, desc=desc),
                    [cutoff, *params, n],
                ).fetchone()
                chunks.append((t0, time.monotonic() - m0, got[0] if got else 0))
                if got is None:
                    return False
                pos, inclusive = tuple(got[1:]), False
                if deadline and time.monotonic() > deadline:
                    return True

        capped = in_parallel(walk)
    elif kind == "copyout" and int_key:
        # archive by hand: per key slice, in one transaction, COPY the old rows out to a file of
        # their own (PostgreSQL's binary format), fsync it, then DELETE the same slice
        directory = Path(spec["archive_dir"])
        directory.mkdir(parents=True, exist_ok=True)
        lo, hi = conn.execute(
            sql.SQL("SELECT min(id), max(id) FROM {} WHERE occurred_at < %s").format(tbl),
            [cutoff],
        ).fetchone()
        copy_out = sql.SQL(
            "COPY (SELECT * FROM {} WHERE id >= {} AND id < {} AND occurred_at < {}) TO STDOUT"
            " (FORMAT binary)"
        )
        delete = sql.SQL("DELETE FROM {} WHERE id >= %s AND id < %s AND occurred_at < %s").format(
            tbl
        )
        key = lo if lo is not None else 1
        while lo is not None and key <= hi:
            t0, m0 = time.time(), time.monotonic()
            with conn.transaction():
                path = directory / f"slice-{key}.copy"
                with open(path, "wb") as out:
                    with conn.cursor().copy(
                        copy_out.format(
                            tbl, sql.Literal(key), sql.Literal(key + n), sql.Literal(cutoff)
                        )
                    ) as copy:
                        for block in copy:
                            out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
                rows = conn.execute(delete, [key, key + n, cutoff]).rowcount
            chunks.append((t0, time.monotonic() - m0, rows))
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
        "cpu": cpu_spent(cpu),
        "rows": sum(c[2] for c in chunks),
        "chunks": chunks,
        "capped": capped,
        "rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
