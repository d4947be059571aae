"""The benchmark dataset: marketplace_events-like rows, generated once per size and variant
into a template table, then copied for each contender so every contender starts equal.

Shape (``rows`` = N): bigint key in time order, ``occurred_at`` spread over the 100 days
before the tick with ±10 minutes of jitter (so 45% are older than the 55-day retention),
tenant 1 holds 40% of the rows and 49 more tenants share the rest skewed toward low
numbers, ~150-byte rows, primary key plus two secondary indexes ((tenant_id, id) and
(occurred_at)).

Variants: ``base``; ``toast`` (a 2,500-byte payload stored out of line, uncompressed);
``cascade`` (base plus a child table of N rows referencing half the events with
``ON DELETE CASCADE``, indexed on its foreign key).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import psycopg
from psycopg import sql

from bench.common import SCHEMA

RETENTION_DAYS = 55
SPAN_DAYS = 100
VARIANTS = ("base", "toast", "cascade")


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    for suffix, factor in (("m", 1_000_000), ("k", 1_000)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * factor)
    return int(text)


def size_label(rows: int) -> str:
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}M"
    if rows % 1_000 == 0:
        return f"{rows // 1_000}k"
    return str(rows)


def cutoff_for(tick: datetime) -> datetime:
    return tick - timedelta(days=RETENTION_DAYS)


def _ident(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(name))


def template_name(rows: int, variant: str) -> str:
    return f"tpl_{variant}_{size_label(rows).lower()}"


_PAYLOAD = {
    "base": "lpad(to_hex(g * 2654435761), 90, 'abcdefghijklmnopqrstuvwxyz')",
    "toast": "rpad(g::text, 2500, 'abcdefghijklmnopqrstuvwxyz0123456789')",
    "cascade": "lpad(to_hex(g * 2654435761), 90, 'abcdefghijklmnopqrstuvwxyz')",
}


def create_template(conn: psycopg.Connection, rows: int, variant: str, tick: datetime) -> dict:
    """(Re)generate the template of ``rows`` rows; returns its facts (eligible rows, seconds)."""
    t0 = time.monotonic()
    name = template_name(rows, variant)
    tbl = _ident(name)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(tbl))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(name + "_items")))
    # The template is never measured: UNLOGGED saves writing it to the WAL.
    conn.execute(
        sql.SQL(
            "CREATE UNLOGGED TABLE {} (id bigint NOT NULL, tenant_id integer NOT NULL,"
            " occurred_at timestamptz NOT NULL, kind text NOT NULL, payload text NOT NULL)"
        ).format(tbl)
    )
    if variant == "toast":
        conn.execute(sql.SQL("ALTER TABLE {} ALTER payload SET STORAGE EXTERNAL").format(tbl))
    conn.execute(
        sql.SQL(
            "INSERT INTO {tbl} SELECT g,"
            " CASE WHEN h.a < 0.4 THEN 1 ELSE 2 + floor(power((h.a - 0.4) / 0.6, 2) * 49)::int END,"
            " %(tick)s::timestamptz - interval '{span} days'"
            "   + ((g - 0.5) / %(n)s)::float8 * interval '{span} days'"
            "   + (h.b - 0.5) * interval '20 minutes',"
            " (ARRAY['page.viewed', 'cart.updated', 'order.created', 'payment.captured'])[1 + g %% 4],"
            " {payload}"
            " FROM generate_series(1, %(n)s::bigint) AS g,"
            " LATERAL (SELECT (hashint8(g) & 2147483647)::float8 / 2147483648 AS a,"
            "                 (hashint8(-g) & 2147483647)::float8 / 2147483648 AS b) AS h"
        ).format(tbl=tbl, span=sql.SQL(str(SPAN_DAYS)), payload=sql.SQL(_PAYLOAD[variant])),
        {"tick": tick, "n": rows},
    )
    if variant == "cascade":
        items = _ident(name + "_items")
        conn.execute(
            sql.SQL(
                "CREATE UNLOGGED TABLE {} (id bigint NOT NULL, event_id bigint NOT NULL, note text NOT NULL)"
            ).format(items)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT 2 * p + k, p, 'line ' || k FROM generate_series(2, %s::bigint, 2) AS p,"
                " generate_series(0, 1) AS k"
            ).format(items),
            [rows],
        )
    cutoff = cutoff_for(tick)
    eligible = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE occurred_at < %s").format(tbl), [cutoff]
    ).fetchone()[0]
    return {"table": name, "rows": rows, "eligible": eligible, "seconds": time.monotonic() - t0}


def make_copy(conn: psycopg.Connection, template: str, variant: str, name: str) -> dict:
    """A fresh, logged copy of ``template`` with its indexes (and child table), vacuumed,
    analyzed and checkpointed. Autovacuum is off on copies so every contender meets the
    same physical state (no vacuum racing some contenders and not others)."""
    t0 = time.monotonic()
    tbl, items = _ident(name), _ident(name + "_items")
    drop_copy(conn, name)
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING STORAGE)"
            " WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
        ).format(tbl, _ident(template))
    )
    conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(tbl, _ident(template)))
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(tbl))
    conn.execute(sql.SQL("CREATE INDEX ON {} (tenant_id, id)").format(tbl))
    conn.execute(sql.SQL("CREATE INDEX ON {} (occurred_at)").format(tbl))
    if variant == "cascade":
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, event_id bigint NOT NULL, note text NOT NULL)"
                " WITH (autovacuum_enabled = false)"
            ).format(items)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT * FROM {}").format(items, _ident(template + "_items"))
        )
        conn.execute(sql.SQL("CREATE INDEX ON {} (event_id)").format(items))
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD FOREIGN KEY (event_id) REFERENCES {} (id) ON DELETE CASCADE"
            ).format(items, tbl)
        )
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(items))
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(tbl))
    conn.execute("CHECKPOINT")
    return {"seconds": time.monotonic() - t0}


def drop_copy(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(name + "_items")))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(_ident(name)))


def remaining_eligible(conn: psycopg.Connection, name: str, cutoff: datetime) -> int:
    return conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE occurred_at < %s").format(_ident(name)), [cutoff]
    ).fetchone()[0]


def orphans(conn: psycopg.Connection, name: str) -> int:
    """Child rows whose event is gone (must be 0: the cascade removes them)."""
    return conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {} AS i WHERE NOT EXISTS (SELECT 1 FROM {} AS e WHERE e.id = i.event_id)"
        ).format(_ident(name + "_items"), _ident(name))
    ).fetchone()[0]
