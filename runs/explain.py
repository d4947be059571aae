"""``retention explain SLUG``: the query plans of every statement the engine runs on a
policy's target table, with EXPLAIN (ANALYZE, BUFFERS) — the DELETE inside a transaction
that is rolled back, so nothing is deleted."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from retention import predicate as P
from retention.schedule_math import latest_tick
from runs.planner import (
    LEDGER_KEY_MAX,
    bounds_query,
    exclusive_end,
    step_query,
    tenants_query,
)


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
    realistic parameters for ``policy`` now (its first eligible key and that key's tenant)."""
    spec = policy.approved_version.parsed
    cutoff = spec.cutoff_for(latest_tick(policy, timezone.now()))
    bounds = bounds_query(policy.id, cutoff, spec)
    with connection.cursor() as cur:
        cur.execute(bounds.sql.as_string(cur.connection), bounds.params)
        lo, hi = cur.fetchone()
    lo, hi = (lo or 0), (hi or 0)
    tenant = None
    if spec.tenant:
        with connection.cursor() as cur:
            query = sql.SQL("SELECT {c}::text FROM {t} WHERE {k} = %s").format(
                c=sql.Identifier(spec.tenant), t=P.table(spec), k=P.col(spec.key)
            )
            cur.execute(query.as_string(cur.connection), [lo])
            row = cur.fetchone()
            tenant = row[0] if row else None
    scope = P.in_scope(spec, tenant=tenant, key_from=lo, key_to=exclusive_end(hi))
    plan_filter = P.eligible(spec, policy_id=policy.id, cutoff=cutoff, include_holds=False)
    where = P.Fragment.join([scope, plan_filter], " AND ")
    delete = P.delete_chunk(
        spec,
        policy_id=policy.id,
        cutoff=cutoff,
        tenant=tenant,
        key_from=lo,
        key_to=exclusive_end(min(lo + spec.chunk_size - 1, LEDGER_KEY_MAX)),
    )
    verify = P.count_where(
        spec, P.eligible(spec, policy_id=policy.id, cutoff=cutoff), limit=100_000
    )
    out = [("planner: eligible key bounds", bounds)]
    if spec.tenant:
        out.append(("planner: distinct tenants (loose index scan)", tenants_query(spec)))
    out += [
        (
            "planner: one step (the key chunk_size rows ahead)",
            step_query(spec, where, spec.chunk_size),
        ),
        ("worker: chunk DELETE (rolled back)", delete),
        ("reconciler: verification count", verify),
    ]
    return out


def explain(policy) -> list[tuple[str, list[str]]]:
    return [(title, _plan(frag)) for title, frag in statements(policy)]
