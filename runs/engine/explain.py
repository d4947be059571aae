"""``retention explain SLUG``: the query plans of every statement the engine runs on a
policy's target table, with EXPLAIN (ANALYZE, BUFFERS) — the DELETE inside a transaction
that is rolled back, so nothing is deleted."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from retention import cascades, geometry
from retention import predicate as P
from retention.schedule_math import latest_tick
from runs.engine.planner import (
    boundaries,
    bounds_query,
    estimate_rows,
    tenants_query,
    walk_filter,
    window_query,
)
from runs.engine.reconciler import bitmap_scan


class _Rollback(Exception):
    pass


VERIFICATION = "reconciler: verification (remaining, held, NULL rows in one statement)"


def _plan(frag: P.Fragment, *, scans=None) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of ``frag`` in a transaction that is rolled back; ``scans``:
    a context manager factory for the planner settings the engine runs the statement with."""
    lines: list[str] = []
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT set_config('statement_timeout', '120s', true)")
            with scans() if scans else nullcontext():
                cur.execute(
                    "EXPLAIN (ANALYZE, BUFFERS) " + frag.sql.as_string(cur.connection),
                    frag.params,
                )
                lines = [row[0] for row in cur.fetchall()]
            raise _Rollback
    except _Rollback:
        pass
    return lines


def statements(policy) -> list[tuple[str, P.Fragment]]:
    """The engine's statements on the target, built by the engine's own functions, with
    realistic parameters for ``policy`` now: the geometry a run created now would take
    (``chunking``), its first eligible bound on that geometry's chunk columns (and that row's
    tenant, for per-tenant chunks), and the first chunk the planner would plan from there."""
    spec = policy.approved_version.parsed
    shape = geometry.choose_safely(spec)
    columns = shape.columns or None
    width = len(P.chunk_columns(spec, columns))
    types = P.column_types(spec)
    integer = P.integer_bounds(spec, columns, types)
    tick = latest_tick(policy, timezone.now())
    cutoff = spec.cutoff_for(tick)
    # the cascade guard, on a table that cascading foreign keys reference (else None)
    _graph, cascade = cascades.for_run(spec, policy_id=policy.id, cutoff=cutoff, tick=tick)
    per_tenant = bool(spec.tenant) and shape.per_tenant
    estimate = None if per_tenant else estimate_rows(spec, columns)
    bounds = bounds_query(policy.id, cutoff, spec, columns=columns, estimate=estimate)
    with connection.cursor() as cur:
        cur.execute(bounds.sql.as_string(cur.connection), bounds.params)
        lo, hi = cur.fetchone()
    if lo is None:  # nothing eligible: plans of the statements over an empty range
        lo = hi = ["0"] if integer else None
    tenant = None
    if per_tenant and lo is not None:
        with connection.cursor() as cur:
            first = P.in_scope(spec, tenant=None, key_from=lo, types=types, columns=columns)
            query = sql.SQL("SELECT {c} FROM {t} WHERE {w} ORDER BY {o} LIMIT 1").format(
                c=P.tenant_text(spec), t=P.table(spec), w=first.sql,
                o=P.key_order(spec, columns=columns),
            )  # fmt: skip
            cur.execute(query.as_string(cur.connection), first.params)
            row = cur.fetchone()
            tenant = row[0] if row else None
    position = P.bound(lo) if lo is not None else None
    last = P.bound(hi) if hi is not None else position
    if position is not None:
        walk = walk_filter(spec, tenant=tenant, last=last, types=types, columns=columns)
    else:  # nothing eligible (and not an integer key): the walk over no keys
        walk, position = P.Fragment(sql.SQL("FALSE"), []), (None,) * width
    window = window_query(spec, walk, position, spec.chunk_size, 1, types, columns)
    with connection.cursor() as cur:
        cur.execute(window.sql.as_string(cur.connection), window.params)
        rows = cur.fetchall()
    planned, _, _, _ = boundaries(
        rows, width=width, position=position, chunk_size=spec.chunk_size, integer=integer
    )
    chunk_to = planned[0][1] if planned and lo is not None else None
    delete = P.delete_chunk(
        spec, policy_id=policy.id, cutoff=cutoff, tenant=tenant, key_from=lo,
        key_to=chunk_to, by_tenant=not per_tenant, columns=columns, cascade=cascade,
    )  # fmt: skip
    verify = P.verification_counts(
        spec, policy_id=policy.id, cutoff=cutoff, outside=(), limit=100_000, types=types,
        cascade=cascade,
    )  # fmt: skip
    out = [("planner: eligible key bounds", bounds)]
    if per_tenant:
        out.append(("planner: distinct tenants (loose index scan)", tenants_query(spec)))
    out += [
        ("planner: one window (chunk boundaries from the key index)", window),
        ("worker: chunk DELETE (rolled back)", delete),
        (VERIFICATION, verify),
    ]
    return out


def _cutoff(policy) -> datetime:
    """The cutoff a run created now would use: the latest tick at or before now, minus the
    retention."""
    return policy.approved_version.parsed.cutoff_for(latest_tick(policy, timezone.now()))


UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}


def cutoff(policy) -> str:
    """The cutoff of the plans below and the bound their statements compare the timestamp
    column with, as PostgreSQL shows it in the plans — for an epoch column a number, said here
    as the instant it counts to."""
    spec = policy.approved_version.parsed
    at = _cutoff(policy)
    local = at.astimezone(ZoneInfo(spec.timezone))
    bound = P.cutoff_value(spec, at)
    line = f"cutoff {local:%Y-%m-%d %H:%M %Z}: the statements compare {spec.timestamp} < {bound}"
    if spec.timestamp_unit:
        line += (
            f" ({bound} {UNIT_NAMES[spec.timestamp_unit]} since 1970-01-01 00:00 UTC"
            f" = {at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)"
        )
    return line


def chunking(policy) -> str:
    """What a run of ``policy`` created now would chunk along, and why (retention.geometry)."""
    shape = geometry.choose_safely(policy.approved_version.parsed)
    on = f" on {shape.bounds_on}" if shape.bounds_on else ""
    return f"chunking: {shape.kind}{on} — {shape.reason}"


def explain(policy) -> list[tuple[str, list[str]]]:
    """The plans of ``statements``; the verification under the scan settings it runs with
    (``runs.engine.reconciler.bitmap_scan``)."""
    spec = policy.approved_version.parsed
    return [
        (title, _plan(frag, scans=(lambda: bitmap_scan(spec)) if title == VERIFICATION else None))
        for title, frag in statements(policy)
    ]
