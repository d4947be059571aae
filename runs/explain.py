"""``retention explain SLUG``: the query plans of every statement the engine runs on a
policy's target table, with EXPLAIN (ANALYZE, BUFFERS) — the DELETE inside a transaction
that is rolled back, so nothing is deleted."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from retention import predicate as P
from retention.schedule_math import latest_tick


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
    """The engine's statements on the target, with realistic parameters for ``policy`` now."""
    spec = policy.approved_version.parsed
    cutoff = spec.cutoff_for(latest_tick(policy, timezone.now()))
    key = P.col(spec.key)
    plan_filter = P.eligible(spec, policy_id=policy.id, cutoff=cutoff, include_holds=False)
    bounds = P.Fragment(
        sql.SQL("SELECT min({k}), max({k}) FROM {t} WHERE {w}").format(
            k=key, t=P.table(spec), w=plan_filter.sql
        ),
        plan_filter.params,
    )
    with connection.cursor() as cur:
        cur.execute(bounds.sql.as_string(cur.connection), bounds.params)
        lo, hi = cur.fetchone()
    lo, hi = (lo or 0), (hi or 0)
    tenant = None
    if spec.tenant:
        with connection.cursor() as cur:
            query = sql.SQL("SELECT {c}::text FROM {t} WHERE {k} = %s").format(
                c=sql.Identifier(spec.tenant), t=P.table(spec), k=key
            )
            cur.execute(query.as_string(cur.connection), [lo])
            row = cur.fetchone()
            tenant = row[0] if row else None
    scope = P.in_scope(spec, tenant=tenant, key_from=lo, key_to=hi + 1)
    where = P.Fragment.join([scope, plan_filter], " AND ")
    probe = P.Fragment(
        sql.SQL("SELECT {k} FROM {t} WHERE {w} ORDER BY {k} OFFSET %s LIMIT 1").format(
            k=key, t=P.table(spec), w=where.sql
        ),
        [*where.params, spec.chunk_size - 1],
    )
    delete = P.delete_chunk(
        spec,
        policy_id=policy.id,
        cutoff=cutoff,
        tenant=tenant,
        key_from=lo,
        key_to=lo + spec.chunk_size,
    )
    verify = P.count_where(
        spec, P.eligible(spec, policy_id=policy.id, cutoff=cutoff), limit=100_000
    )
    out = [
        ("planner: eligible key bounds", bounds),
        ("planner: one step (key chunk_size rows ahead)", probe),
        ("worker: chunk DELETE (rolled back)", delete),
        ("reconciler: verification count", verify),
    ]
    if spec.tenant:
        from runs.planner import tenants  # noqa: F401 - the same loose index scan

        tcol = sql.Identifier(spec.tenant)
        tbl = sql.SQL("{}.{}").format(sql.Identifier(spec.schema), sql.Identifier(spec.table))
        walk = sql.SQL(
            "WITH RECURSIVE walk(v) AS ( (SELECT {t} FROM {tbl} WHERE {t} IS NOT NULL ORDER BY {t} LIMIT 1)"
            " UNION ALL SELECT (SELECT {t} FROM {tbl} WHERE {t} > walk.v ORDER BY {t} LIMIT 1) FROM walk"
            " WHERE walk.v IS NOT NULL) SELECT v::text FROM walk WHERE v IS NOT NULL"
        ).format(t=tcol, tbl=tbl)
        out.insert(1, ("planner: distinct tenants (loose index scan)", P.Fragment(walk, [])))
    return out


def explain(policy) -> list[tuple[str, list[str]]]:
    return [(title, _plan(frag)) for title, frag in statements(policy)]
