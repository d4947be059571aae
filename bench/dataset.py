"""The benchmark dataset: marketplace_events-like rows, generated once per size and shape
into a template table, then copied for each contender so every contender starts equal.

Base layout (``rows`` = N): ``occurred_at`` spread over the 100 days before the tick with ±10
minutes of jitter (so 45% are older than the 55-day retention), tenant 1 holds 40% of the rows
and 49 more tenants share the rest skewed toward low numbers, ~150-byte rows. A ``Shape``
changes one thing at a time: the key (bigint, uuid v4, uuid v7, composite), the ages (random
vs the key), how tenants sit in the heap (interleaved, clustered), the indexes, the payload
(TOAST) or a child table (``ON DELETE CASCADE``). ``SHAPES`` is the shape matrix
(``bench/run.py --shapes``); ``VARIANT_SHAPES`` are the side-by-side run's variants
(``base``, ``toast``, ``cascade``). Fragments in a shape are SQL text of this file only
(never input), composed with ``psycopg.sql``; ``%%`` stands for ``%``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import psycopg
from psycopg import sql

from bench.common import SCHEMA

RETENTION_DAYS = 55
SPAN_DAYS = 100

_SKEWED = "CASE WHEN a < 0.4 THEN 1 ELSE 2 + floor(power((a - 0.4) / 0.6, 2) * 49)::int END"
_JITTER = "t0 + (b - 0.5) * interval '20 minutes'"
_RANDOM_AGE = "%(tick)s::timestamptz - c * interval '100 days'"
_SMALL = "lpad(to_hex(g * 2654435761), 90, 'abcdefghijklmnopqrstuvwxyz')"
_TOAST = "rpad(g::text, 2500, 'abcdefghijklmnopqrstuvwxyz0123456789')"
# uuid v7 layout: 48-bit Unix milliseconds, version 7, 12 random bits, variant 10xx, 62 random bits.
_UUID_V7 = (
    "(lpad(to_hex((extract(epoch FROM t0) * 1000)::bigint), 12, '0') || '7'"
    " || substr(md5(g::text), 1, 3) || substr('89ab', 1 + (g %% 4)::int, 1)"
    " || substr(md5(g::text), 4, 15))::uuid"
)


@dataclass(frozen=True)
class Shape:
    """How one table of the benchmark is laid out: its key, how tenants and ages sit in the
    heap, which indexes it has, and what a policy on it names. One description serves the
    template, the copies, the foreground load, the loops and the product's policy.

    SQL fragments see ``g`` (row number, insertion order), ``a``/``b``/``c`` (three independent
    uniform hashes of ``g`` in [0, 1)), ``t0`` (the row's insertion time: the span, in ``g``
    order) and, for ``id_sql``/``tenant_sql``, ``ts`` (its ``occurred_at``)."""

    name: str
    meaning: str
    key_type: str = "bigint"  # bigint | uuid
    id_sql: str = "g"
    key_kind: str = "bigint"  # bigint | uuid-v4 | uuid-v7: how the foreground makes new keys
    tenant_sql: str = _SKEWED
    ts_sql: str = _JITTER
    order_sql: str = ""  # physical order of the template (ORDER BY of its INSERT), "" = g
    payload_sql: str = _SMALL
    toast: bool = False
    cascade: bool = False
    pk: tuple[str, ...] = ("id",)
    indexes: tuple[tuple[str, ...], ...] = (("tenant_id", "id"), ("occurred_at",))
    tenant_policy: bool = False  # the product's policy says tenant = "tenant_id"
    tenant_read_order: str = "id"  # the foreground's "latest 10 of a tenant" orders by this

    @property
    def int_key(self) -> bool:
        """A single integer key: the hand-written key-range loop does arithmetic on it."""
        return self.pk == ("id",) and self.key_type == "bigint"

    @property
    def policy_key(self):
        return self.pk[0] if len(self.pk) == 1 else list(self.pk)


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("time-bigint", "bigint key in time order, tenant 1 holds 40%, (tenant_id, id) index"),
        Shape("random-ages", "bigint key; occurred_at uniform over the span, not correlated with the key",
              ts_sql=_RANDOM_AGE),
        Shape("interleaved-50", "50 tenants round-robin on every heap page; only (tenant_id, occurred_at)"
              " and (occurred_at) indexed; policy tenant = tenant_id",
              tenant_sql="1 + (g %% 50)::int", indexes=(("tenant_id", "occurred_at"), ("occurred_at",)),
              tenant_policy=True, tenant_read_order="occurred_at"),
        Shape("interleaved-random-tenant", "60 tenants round-robin on every heap page, occurred_at"
              " uniform over the span (not correlated with the key); only (tenant_id, occurred_at)"
              " and (occurred_at) indexed; policy tenant = tenant_id (a user's accounts table)",
              tenant_sql="1 + (g %% 60)::int", ts_sql=_RANDOM_AGE,
              indexes=(("tenant_id", "occurred_at"), ("occurred_at",)), tenant_policy=True,
              tenant_read_order="occurred_at"),
        Shape("clustered-tenants", "heap clustered by tenant (each tenant's rows contiguous, in key"
              " order); (tenant_id, id) index; policy tenant = tenant_id",
              order_sql="tenant_id, id", tenant_policy=True),
        Shape("uuid-v4", "random uuid key (heap in insertion order, key order unrelated)",
              key_type="uuid", key_kind="uuid-v4", id_sql="md5(g::text)::uuid"),
        Shape("uuid-v7", "time-ordered uuid key (48-bit millisecond prefix of the insertion time)",
              key_type="uuid", key_kind="uuid-v7", id_sql=_UUID_V7),
        Shape("composite", "primary key (tenant_id, id), bigint id in time order, no index on id alone",
              pk=("tenant_id", "id"), indexes=(("occurred_at",),)),
        Shape("toast", "time-bigint with a 2,500-byte payload stored out of line, uncompressed",
              payload_sql=_TOAST, toast=True),
    )
}  # fmt: skip
# The side-by-side run's variants are shapes too.
VARIANT_SHAPES = {
    "base": replace(SHAPES["time-bigint"], name="base"),
    "toast": SHAPES["toast"],
    "cascade": replace(SHAPES["time-bigint"], name="cascade", cascade=True),
}
VARIANTS = tuple(VARIANT_SHAPES)


def shape_of(name: str) -> Shape:
    shape = VARIANT_SHAPES.get(name) or SHAPES.get(name)
    if shape is None:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join([*SHAPES, *VARIANT_SHAPES])}")
    return shape


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


def template_name(rows: int, shape: str) -> str:
    return f"tpl_{shape.replace('-', '_')}_{size_label(rows).lower()}"


def copy_name(shape: str, contender: str) -> str:
    return f"c_{shape}_{contender}".replace("-", "_")


def _cols(names) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def create_template(conn: psycopg.Connection, rows: int, variant: str, tick: datetime) -> dict:
    """(Re)generate the template of ``rows`` rows of shape ``variant``; returns its facts
    (eligible rows, seconds)."""
    t0 = time.monotonic()
    shape = shape_of(variant)
    name = template_name(rows, shape.name)
    tbl = _ident(name)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(tbl))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(name + "_items")))
    # The template is never measured: UNLOGGED saves writing it to the WAL.
    conn.execute(
        sql.SQL(
            "CREATE UNLOGGED TABLE {} (id {} NOT NULL, tenant_id integer NOT NULL,"
            " occurred_at timestamptz NOT NULL, kind text NOT NULL, payload text NOT NULL)"
        ).format(tbl, sql.SQL(shape.key_type))
    )
    if shape.toast:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER payload SET STORAGE EXTERNAL").format(tbl))
    conn.execute(
        sql.SQL(
            "INSERT INTO {tbl} SELECT * FROM ("
            " SELECT {id} AS id, {tenant} AS tenant_id, ts AS occurred_at,"
            "  (ARRAY['page.viewed', 'cart.updated', 'order.created', 'payment.captured'])[1 + g %% 4] AS kind,"
            "  {payload} AS payload"
            " FROM generate_series(1, %(n)s::bigint) AS g,"
            " LATERAL (SELECT (hashint8(g) & 2147483647)::float8 / 2147483648 AS a,"
            "                 (hashint8(-g) & 2147483647)::float8 / 2147483648 AS b,"
            "                 (hashint8(g * 7919) & 2147483647)::float8 / 2147483648 AS c,"
            "                 %(tick)s::timestamptz - interval '{span} days'"
            "                   + ((g - 0.5) / %(n)s)::float8 * interval '{span} days' AS t0) AS h,"
            " LATERAL (SELECT {ts} AS ts) AS x) AS r {order}"
        ).format(
            tbl=tbl,
            span=sql.SQL(str(SPAN_DAYS)),
            payload=sql.SQL(shape.payload_sql),
            id=sql.SQL(shape.id_sql),
            tenant=sql.SQL(shape.tenant_sql),
            ts=sql.SQL(shape.ts_sql),
            order=sql.SQL("ORDER BY " + shape.order_sql if shape.order_sql else ""),
        ),  # fmt: skip
        {"tick": tick, "n": rows},
    )
    if shape.cascade:
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
    return {
        "table": name, "shape": shape.name, "meaning": shape.meaning, "rows": rows,
        "eligible": eligible, "seconds": time.monotonic() - t0,
    }  # fmt: skip


def make_copy(conn: psycopg.Connection, template: str, variant: str, name: str) -> dict:
    """A fresh, logged copy of ``template`` with the shape's primary key and indexes (and child
    table), vacuumed, analyzed and checkpointed. Autovacuum is off on copies so every contender
    meets the same physical state (no vacuum racing some contenders and not others)."""
    t0 = time.monotonic()
    shape = shape_of(variant)
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
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(tbl, _cols(shape.pk)))
    for columns in shape.indexes:
        conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(tbl, _cols(columns)))
    if shape.cascade:
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
