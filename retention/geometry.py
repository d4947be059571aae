"""What a run chunks along, chosen from the catalog (``chunking`` in the policy).

- ``tenant``: per-tenant chunks ``[from, to)`` on a ``(tenant, key…)`` index — each chunk is
  one tenant's, so tenant ceilings and per-tenant order apply. Good when a tenant's rows
  cluster on the heap; when tenants interleave, a tenant's key interval spans the table and
  every chunk reads and dirties pages all over it, and concurrent chunks share pages.
- ``key``: key-range chunks across all tenants, in key order — on a table whose key follows
  insertion, in physical order: each chunk touches its own run of pages, and concurrent
  chunks touch different pages. The tenant stays in the DELETE's predicate (legal holds by
  tenant are a ``NOT EXISTS`` inside it) and the audit record counts rows per tenant.
- ``timestamp``: chunks across all tenants in timestamp order, their bounds on the chunk
  columns ``(timestamp, key…)`` when an index leads with exactly those, else ``(timestamp,)``
  (a non-unique column: half-open ranges on its distinct values). For a key that does not
  follow insertion (a random uuid) on a table whose rows arrive in time order: each chunk is
  a contiguous run of pages, as key-range chunks are over a time-ordered key. Only the
  chunk's scope uses those columns; legal holds, keep rules, NULL keys and partitions use the
  key as always.

``auto`` decides from the table: the key's first column out of heap order (``pg_stats``
correlation below ``KEY_SCATTERED`` in magnitude) while the timestamp follows it (at least
``TIME_ORDERED``), with an index leading with the timestamp → timestamp; without statistics
(no ``ANALYZE`` yet) that rule does not apply. Otherwise: no tenant column → key; no
``(tenant, key…)`` index → key; otherwise a sample of heap pages (``TABLESAMPLE SYSTEM``,
about 200 pages, whole pages only) says on how many pages tenants mix: on half of them or
more → key, else tenant. The run records the choice, its reason and its chunk columns at
creation; the preview and ``retention explain`` show the same decision for the table as it is
now.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from psycopg import sql

from core import timeouts
from retention import predicate as P
from retention.spec import PolicySpec

TENANT = "tenant"
KEY = "key"
TIMESTAMP = "timestamp"
INTERLEAVED = 0.5  # tenants mix on at least this share of sampled pages: key-range chunks
SAMPLE_PAGES = 200
# auto picks timestamp-ordered chunks when |correlation| (pg_stats: physical order against
# value order, -1..1) of the key's first column is below KEY_SCATTERED and the timestamp's is
# at least TIME_ORDERED (a descending order is an order too)
KEY_SCATTERED = 0.5
TIME_ORDERED = 0.9


@dataclass(frozen=True)
class Geometry:
    kind: str  # "tenant" | "key" | "timestamp"
    reason: str
    columns: tuple[str, ...] = ()  # timestamp chunks: the columns their bounds are on

    @property
    def per_tenant(self) -> bool:
        return self.kind == TENANT

    @property
    def bounds_on(self) -> str:
        """The chunk columns as people read them (empty for chunks on the key)."""
        return label(self.columns) if self.columns else ""


def label(columns) -> str:
    """``occurred_at`` or ``(occurred_at, id)``."""
    columns = tuple(columns)
    return columns[0] if len(columns) == 1 else f"({', '.join(columns)})"


def _fetchone(query, params):
    with connection.cursor() as cur:
        cur.execute(query.as_string(cur.connection), params)
        return cur.fetchone()


def has_tenant_key_index(spec: PolicySpec) -> bool:
    """A valid, non-partial btree index leading with (tenant…, key…)."""
    leading = list(dict.fromkeys([*spec.tenant_columns, *spec.key_columns]))
    (found,) = _fetchone(
        sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
            " JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid"
            " JOIN pg_catalog.pg_am am ON am.oid = ic.relam"
            " WHERE i.indrelid = to_regclass(%s) AND am.amname = 'btree' AND i.indisvalid"
            " AND i.indpred IS NULL"
            " AND (i.indkey::int2[])[0:%s] = ARRAY(SELECT a.attnum FROM unnest(%s::text[])"
            "  WITH ORDINALITY AS c(name, n) JOIN pg_catalog.pg_attribute a"
            "  ON a.attrelid = i.indrelid AND a.attname = c.name ORDER BY c.n)::int2[])"
        ),
        [f'"{spec.schema}"."{spec.table}"', len(leading) - 1, leading],
    )
    return bool(found)


def index_columns(spec: PolicySpec) -> list[tuple]:
    """The key columns (names, in order; None for an expression) of every valid, non-partial
    btree index on the table."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT ARRAY(SELECT a.attname FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1])"
            "  WITH ORDINALITY AS k(attnum, n) LEFT JOIN pg_catalog.pg_attribute a"
            "  ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n)"
            " FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid"
            " JOIN pg_catalog.pg_am am ON am.oid = ic.relam"
            " WHERE i.indrelid = to_regclass(%s) AND am.amname = 'btree' AND i.indisvalid"
            " AND i.indpred IS NULL",
            [f'"{spec.schema}"."{spec.table}"'],
        )
        return [tuple(row[0]) for row in cur.fetchall()]


def timestamp_columns(spec: PolicySpec) -> tuple[str, ...] | None:
    """The chunk columns of timestamp-ordered chunks: ``(timestamp, key…)`` when a valid,
    non-partial btree index leads with exactly those columns, else ``(timestamp,)`` when one
    leads with the timestamp; None when no index leads with it."""
    full = tuple(dict.fromkeys([spec.timestamp, *spec.key_columns]))
    indexes = index_columns(spec)
    if any(cols[: len(full)] == full for cols in indexes):
        return full
    if any(cols[:1] == (spec.timestamp,) for cols in indexes):
        return (spec.timestamp,)
    return None


def correlations(spec: PolicySpec) -> dict[str, float]:
    """``pg_stats.correlation`` of the key's first column and of the timestamp column (the
    table's own statistics before those of its inheritance tree); a column without statistics
    (no ANALYZE yet) is left out."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT ON (attname) attname, correlation FROM pg_catalog.pg_stats"
            " WHERE schemaname = %s AND tablename = %s AND attname = ANY(%s)"
            " AND correlation IS NOT NULL ORDER BY attname, inherited",
            [spec.schema, spec.table, [spec.key_columns[0], spec.timestamp]],
        )
        return {name: float(value) for name, value in cur.fetchall()}


def timestamp_order(spec: PolicySpec) -> Geometry | None:
    """Timestamp-ordered chunks when the key does not follow the heap's order but the
    timestamp does, and an index leads with the timestamp; None: today's rules decide."""
    first = spec.key_columns[0]
    if first == spec.timestamp:  # key-range chunks are in timestamp order already
        return None
    found = correlations(spec)
    if first not in found or spec.timestamp not in found:
        return None
    key_c, ts_c = found[first], found[spec.timestamp]
    if abs(key_c) >= KEY_SCATTERED or abs(ts_c) < TIME_ORDERED:
        return None
    columns = timestamp_columns(spec)
    if columns is None:
        return None
    return Geometry(
        TIMESTAMP,
        f"key {first} is not in heap order (correlation {key_c:.2f}), {spec.timestamp} is"
        f" ({ts_c:.2f}): timestamp-ordered chunks on {label(columns)}",
        columns,
    )


def mixed_pages(spec: PolicySpec) -> tuple[float | None, int]:
    """(share of sampled heap pages holding more than one tenant, pages sampled); share None
    when the table has no page to sample."""
    (pages,) = _fetchone(
        sql.SQL("SELECT relpages FROM pg_catalog.pg_class WHERE oid = to_regclass(%s)"),
        [f'"{spec.schema}"."{spec.table}"'],
    )
    percent = 100.0 if not pages or pages <= SAMPLE_PAGES else 100.0 * SAMPLE_PAGES / pages
    row = _fetchone(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE n > 1), count(*) FROM ("
            " SELECT (ctid::text::point)[0] AS page, count(DISTINCT {t}) AS n"
            " FROM {s}.{r} AS {row} TABLESAMPLE SYSTEM (%s) WHERE NOT {null} GROUP BY 1) AS p"
        ).format(
            t=P.tenant_text(spec),
            s=sql.Identifier(spec.schema),
            r=sql.Identifier(spec.table),
            row=P.ROW,
            null=P.tenant_is_null(spec),
        ),  # fmt: skip
        [percent],
    )
    mixed, total = row
    return (mixed / total if total else None), int(total)


def choose_safely(spec: PolicySpec) -> Geometry:
    """``choose``, bounded and in a savepoint: a table that cannot be sampled now (locked,
    gone) gets per-tenant chunks when it has a tenant (the run's DELETEs then fail or proceed
    on their own)."""
    try:
        with (
            transaction.atomic(),
            timeouts.bounded(timeouts.engine_statement_ms(), timeouts.target_lock_ms(spec)),
        ):
            return choose(spec)
    except DatabaseError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if getattr(spec, "chunking", "auto") == TIMESTAMP:  # the policy's own choice stands
            return Geometry(
                TIMESTAMP,
                f"the indexes could not be read ({first[:200]}): timestamp-ordered chunks on"
                f' {spec.timestamp} (chunking = "timestamp")',
                (spec.timestamp,),
            )
        kind = TENANT if spec.tenant and getattr(spec, "null_tenant", "keep") != "delete" else KEY
        return Geometry(kind, f"the table could not be sampled ({first[:200]}): {kind} chunks")


def choose(spec: PolicySpec) -> Geometry:
    """The geometry a run of ``spec`` uses on the table as it is now, and why."""
    pinned = getattr(spec, "chunking", "auto")
    if pinned == TIMESTAMP:
        columns = timestamp_columns(spec)
        if columns is None:  # validated with one; dropped since: correct, every chunk scans
            return Geometry(
                TIMESTAMP,
                f"timestamp-ordered chunks on {spec.timestamp}, no index leads with it"
                ' (chunking = "timestamp")',
                (spec.timestamp,),
            )
        return Geometry(
            TIMESTAMP, f'timestamp-ordered chunks on {label(columns)} (chunking = "timestamp")',
            columns,
        )  # fmt: skip
    if pinned == "auto":
        ordered = timestamp_order(spec)
        if ordered is not None:
            return ordered
    if not spec.tenant:
        return Geometry(KEY, "no tenant column: key-range chunks")
    if pinned == TENANT:
        return Geometry(TENANT, 'per-tenant chunks (chunking = "tenant")')
    if pinned == KEY:
        return Geometry(KEY, 'key-range chunks across tenants (chunking = "key")')
    if getattr(spec, "null_tenant", "keep") == "delete":
        return Geometry(
            KEY, 'rows without a tenant are deleted too (null_tenant = "delete"): key-range chunks'
        )
    if set(spec.tenant_columns) <= set(spec.key_columns):
        return Geometry(KEY, "the key holds the tenant column: key-range chunks")
    if not has_tenant_key_index(spec):
        leading = ", ".join(dict.fromkeys([*spec.tenant_columns, *spec.key_columns]))
        return Geometry(KEY, f"no ({leading}) index: key-range chunks")
    share, sampled = mixed_pages(spec)
    if share is None:
        return Geometry(TENANT, "empty table: per-tenant chunks")
    pct = round(100 * share)
    if share >= INTERLEAVED:
        return Geometry(
            KEY, f"tenants interleave on {pct}% of {sampled} sampled pages: key-range chunks"
        )
    return Geometry(
        TENANT, f"tenants cluster (mixed on {pct}% of {sampled} sampled pages): per-tenant chunks"
    )
