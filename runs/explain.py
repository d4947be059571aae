"""``retention explain SLUG``: the query plans of every statement the engine runs on a
policy's target table, with EXPLAIN (ANALYZE, BUFFERS) — the DELETE inside a transaction
that is rolled back, so nothing is deleted."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from retention import geometry
from retention import predicate as P
from retention.schedule_math import latest_tick
from runs.planner import bounds_query, exclusive_end, step_query, tenants_query


class _Rollback(Exception):
    pass


def _plan(frag: P.Fragment) -> list[str]:
    lines: list[str] = []
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT set_config('statement_timeout', '120s', true)")
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + frag.sql.as_string(cur.connection), frag.params
            )
            lines = [row[0] for row in cur.fetchall()]
            raise _Rollback
    except _Rollback:
        pass
    return lines


def statements(policy) -> list[tuple[str, P.Fragment]]:
    """The engine's statements on the target, built by the engine's own functions, with
    realistic parameters for ``policy`` now (its first eligible key and that key's tenant,
    and the first chunk the planner would plan from there)."""
    spec = policy.approved_version.parsed
    types = P.column_types(spec)
    cutoff = spec.cutoff_for(latest_tick(policy, timezone.now()))
    bounds = bounds_query(policy.id, cutoff, spec)
    with connection.cursor() as cur:
        cur.execute(bounds.sql.as_string(cur.connection), bounds.params)
        lo, hi = cur.fetchone()
    if lo is None:  # nothing eligible: plans of the statements over an empty range
        lo = hi = ["0"] * len(spec.key_columns) if P.integer_key(spec, types) else None
    tenant = None
    if spec.tenant and lo is not None:
        with connection.cursor() as cur:
            first = P.in_scope(spec, tenant=None, key_from=lo, types=types)
            query = sql.SQL("SELECT {c}::text FROM {t} WHERE {w} ORDER BY {o} LIMIT 1").format(
                c=sql.Identifier(spec.tenant), t=P.table(spec), w=first.sql, o=P.key_order(spec)
            )
            cur.execute(query.as_string(cur.connection), first.params)
            row = cur.fetchone()
            tenant = row[0] if row else None
    scope = P.in_scope(spec, tenant=tenant, key_from=lo, types=types)
    parts = [scope]
    if hi is not None:
        parts.append(P.key_compare(spec, "<=", P.bound(hi), types))
    plan_filter = P.eligible(spec, policy_id=policy.id, cutoff=cutoff, include_holds=False)
    where = P.Fragment.join([*parts, plan_filter], " AND ")
    step = step_query(spec, where, spec.chunk_size)
    with connection.cursor() as cur:
        cur.execute(step.sql.as_string(cur.connection), step.params)
        ahead = cur.fetchall()
    if P.integer_key(spec, types):
        last = int(ahead[0][0]) if ahead else int((lo or ["0"])[0]) + spec.chunk_size - 1
        chunk_to = exclusive_end(last)
    else:
        chunk_to = P.bound(ahead[1]) if len(ahead) == 2 else None
    delete = P.delete_chunk(
        spec, policy_id=policy.id, cutoff=cutoff, tenant=tenant, key_from=lo, key_to=chunk_to
    )
    verify = P.count_where(
        spec, P.eligible(spec, policy_id=policy.id, cutoff=cutoff), limit=100_000
    )
    out = [("planner: eligible key bounds", bounds)]
    if spec.tenant:
        out.append(("planner: distinct tenants (loose index scan)", tenants_query(spec)))
    out += [
        ("planner: one step (the key chunk_size rows ahead)", step),
        ("worker: chunk DELETE (rolled back)", delete),
        ("reconciler: verification count", verify),
    ]
    return out


def chunking(policy) -> str:
    """What a run of ``policy`` created now would chunk along, and why (retention.geometry)."""
    shape = geometry.choose_safely(policy.approved_version.parsed)
    return f"chunking: {shape.kind} — {shape.reason}"


def explain(policy) -> list[tuple[str, list[str]]]:
    return [(title, _plan(frag)) for title, frag in statements(policy)]
