"""Foreground load (``python -m bench.load SPEC_JSON``): one connection issuing a fixed-rate
mix of indexed reads and inserts against the table being cleaned.

Open loop: operation k is scheduled at ``t0 + k / rate`` and its latency is measured from
that scheduled time, so a stall also counts against every operation queued behind it
(lateness is latency). The mix: 40% point reads by primary key of retained rows (a fixed
sample of them, drawn before the clock starts), 30% "latest 10 events of a tenant" reads
(ordered by the shape's tenant index: ``id`` or ``occurred_at``), 30% inserts of new events
with a new key of the shape's kind (the next bigint, a random uuid v4, a uuid v7 of now).

Protocol: prints ``ready``; ``go`` on stdin starts the clock; ``stop`` ends it; then one
JSON line: ``{"t0": epoch, "ops": [[scheduled_offset_s, latency_ms, kind], ...]}``.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid

import psycopg
from psycopg import sql

from bench.common import SCHEMA


def new_key(kind: str, next_id: int):
    if kind == "uuid-v4":
        return uuid.uuid4()
    if kind == "uuid-v7":
        ms = int(time.time() * 1000)
        rand = random.getrandbits(74)
        value = (
            (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & (2**62 - 1))
        )
        return uuid.UUID(int=value)
    return next_id


def main(spec: dict) -> dict:
    tbl = sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(spec["table"]))
    conn = psycopg.connect(spec["dsn"], autocommit=True, application_name="bench-load")
    rng = random.Random(spec.get("seed", 7))
    random.seed(spec.get("seed", 7))
    pk = spec.get("pk", ["id"])
    kind_of_key = spec.get("key_kind", "bigint")
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in pk)
    marks = sql.SQL(", ").join(sql.Placeholder() * len(pk))
    keys = conn.execute(
        sql.SQL(
            "SELECT {} FROM {} TABLESAMPLE SYSTEM (5) REPEATABLE (7) WHERE occurred_at >= %s LIMIT 5000"
        ).format(cols, tbl),
        [spec["cutoff"]],
    ).fetchall()
    next_id = 0
    if kind_of_key == "bigint":
        next_id = conn.execute(sql.SQL("SELECT max(id) + 1 FROM {}").format(tbl)).fetchone()[0]
    point = sql.SQL("SELECT * FROM {} WHERE ({}) = ({})").format(tbl, cols, marks)
    latest = sql.SQL(
        "SELECT id, kind FROM {} WHERE tenant_id = %s ORDER BY {} DESC LIMIT 10"
    ).format(tbl, sql.Identifier(spec.get("tenant_order", "id")))
    insert = sql.SQL(
        "INSERT INTO {} (id, tenant_id, occurred_at, kind, payload)"
        " VALUES (%s, %s, now(), 'page.viewed', %s)"
    ).format(tbl)
    payload = "x" * spec.get("payload_bytes", 90)
    for _ in range(20):  # warm up: plans prepared, caches touched
        conn.execute(point, rng.choice(keys), prepare=True)
        conn.execute(latest, [rng.randint(1, 50)], prepare=True)

    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    print("ready", flush=True)
    sys.stdin.readline()
    threading.Thread(target=wait_for_stop, daemon=True).start()
    interval = 1.0 / spec["rate"]
    t0 = time.monotonic()
    t0_epoch = time.time()
    ops: list[tuple[float, float, str]] = []
    k = 0
    while not stop.is_set():
        scheduled = t0 + k * interval
        delay = scheduled - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        r = rng.random()
        if r < 0.4:
            kind = "read"
            conn.execute(point, rng.choice(keys), prepare=True).fetchall()
        elif r < 0.7:
            kind = "tenant"
            conn.execute(latest, [1 + int(rng.random() ** 2 * 50)], prepare=True).fetchall()
        else:
            kind = "insert"
            conn.execute(
                insert, [new_key(kind_of_key, next_id), rng.randint(1, 50), payload], prepare=True
            )
            next_id += 1
        ops.append(
            (round(scheduled - t0, 4), round((time.monotonic() - scheduled) * 1000, 3), kind)
        )
        k += 1
    return {"t0": t0_epoch, "rate": spec["rate"], "ops": ops}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
