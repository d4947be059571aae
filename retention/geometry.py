"""What a run chunks along, chosen from the catalog (``chunking`` in the policy).

- ``tenant``: per-tenant chunks ``[from, to)`` on a ``(tenant, key…)`` index — each chunk is
  one tenant's, so tenant ceilings and per-tenant order apply. Good when a tenant's rows
  cluster on the heap; when tenants interleave, a tenant's key interval spans the table and
  every chunk reads and dirties pages all over it, and concurrent chunks share pages.
- ``key``: key-range chunks across all tenants, in key order — on a table whose key follows
  insertion, in physical order: each chunk touches its own run of pages, and concurrent
  chunks touch different pages. The tenant stays in the DELETE's predicate (legal holds by
  tenant are a ``NOT EXISTS`` inside it) and the audit record counts rows per tenant.

``auto`` decides from the table: no tenant column → key; no ``(tenant, key…)`` index → key;
otherwise a sample of heap pages (``TABLESAMPLE SYSTEM``, about 200 pages, whole pages
only) says on how many pages tenants mix: on half of them or more → key, else tenant. The
run records the choice and its reason at creation; the preview and ``retention explain`` show
the same decision for the table as it is now.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from psycopg import sql

from core import timeouts
from retention.spec import PolicySpec

TENANT = "tenant"
KEY = "key"
INTERLEAVED = 0.5  # tenants mix on at least this share of sampled pages: key-range chunks
SAMPLE_PAGES = 200


@dataclass(frozen=True)
class Geometry:
    kind: str  # "tenant" | "key"
    reason: str
    columns: tuple[str, ...] = ()  # the columns chunk bounds are on when not the key's

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
    """A valid, non-partial btree index leading with (tenant, key…)."""
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
        [
            f'"{spec.schema}"."{spec.table}"',
            len(spec.key_columns),
            list(dict.fromkeys([spec.tenant, *spec.key_columns])),
        ],
    )
    return bool(found)


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
            " FROM {s}.{r} TABLESAMPLE SYSTEM (%s) WHERE {t} IS NOT NULL GROUP BY 1) AS p"
        ).format(
            t=sql.Identifier(spec.tenant),
            s=sql.Identifier(spec.schema),
            r=sql.Identifier(spec.table),
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
        with transaction.atomic(), timeouts.bounded(timeouts.engine_statement_ms()):
            return choose(spec)
    except DatabaseError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        kind = TENANT if spec.tenant else KEY
        return Geometry(kind, f"the table could not be sampled ({first[:200]}): {kind} chunks")


def choose(spec: PolicySpec) -> Geometry:
    """The geometry a run of ``spec`` uses on the table as it is now, and why."""
    pinned = getattr(spec, "chunking", "auto")
    if not spec.tenant:
        return Geometry(KEY, "no tenant column: key-range chunks")
    if pinned == TENANT:
        return Geometry(TENANT, 'per-tenant chunks (chunking = "tenant")')
    if pinned == KEY:
        return Geometry(KEY, 'key-range chunks across tenants (chunking = "key")')
    if spec.tenant in spec.key_columns:
        return Geometry(KEY, "the key holds the tenant column: key-range chunks")
    if not has_tenant_key_index(spec):
        return Geometry(
            KEY, f"no ({spec.tenant}, {', '.join(spec.key_columns)}) index: key-range chunks"
        )
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
