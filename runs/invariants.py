"""The invariant checker: compares a run's table with its audit trail.

With a shadow copy of the table taken before the run (tests and drills keep
one), it proves exactly which rows are gone; without one it checks what the
ledger alone can prove (one audit row per finished chunk, chain intact,
nothing eligible left).
"""

from __future__ import annotations

import dataclasses

from django.db import connection
from django.db.models import Count, Sum
from psycopg import sql

from retention import predicate as P
from runs.audit import verify_chain
from runs.models import AuditRecord, Chunk, Run


def _scalar(query: sql.Composable, params: list) -> int:
    with connection.cursor() as cur:
        cur.execute(query.as_string(cur.connection), params)
        return cur.fetchone()[0]


def check_run(
    run: Run, *, shadow: tuple[str, str] | None = None, expect_drained: bool = True
) -> list[str]:
    """Return the list of broken invariants (empty when all hold)."""
    problems: list[str] = []
    spec = run.policy_version.parsed
    done = set(Chunk.objects.filter(run=run, state=Chunk.State.DONE).values_list("id", flat=True))
    audited = dict(
        AuditRecord.objects.filter(run=run)
        .values_list("chunk_id")
        .annotate(n=Count("id"))
        .values_list("chunk_id", "n")
    )
    if set(audited) != done:
        missing, extra = done - set(audited), set(audited) - done
        if missing:
            problems.append(f"{len(missing)} finished chunk(s) without an audit row")
        if extra:
            problems.append(f"{len(extra)} audit row(s) for chunks that are not done")
    if any(n != 1 for n in audited.values()):
        problems.append("a chunk has more than one audit row")
    chain = verify_chain()
    problems.extend(f"audit chain: {p}" for p in chain.problems)

    if expect_drained:
        frag = P.count_where(
            spec, P.eligible(spec, policy_id=run.policy_id, cutoff=run.cutoff), limit=1000
        )
        left = _scalar(frag.sql, frag.params)
        if left:
            problems.append(f"{left} eligible row(s) still present under the cutoff")

    if shadow is not None:
        shadow_spec = dataclasses.replace(spec, schema=shadow[0], table=shadow[1])
        target = sql.SQL("{}.{}").format(sql.Identifier(spec.schema), sql.Identifier(spec.table))
        gone = sql.SQL(
            "{tk} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {target} AS x WHERE x.{k} = {tk})"
        ).format(target=target, k=sql.Identifier(spec.key), tk=P.col(spec.key))
        # Rows without a key cannot be matched one by one; they are never eligible, so all
        # of them must still be there.
        null_keys = sql.SQL("SELECT count(*) FROM {} WHERE {} IS NULL")
        before = _scalar(null_keys.format(P.table(shadow_spec), P.col(spec.key)), [])
        after = _scalar(null_keys.format(P.table(spec), P.col(spec.key)), [])
        if after != before:
            problems.append(f"{before - after} row(s) with a NULL key are gone")
        gone_count = _scalar(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(P.table(shadow_spec), gone), []
        )
        audited_rows = (
            AuditRecord.objects.filter(
                policy_slug=spec.slug, table_name=spec.qualified_table
            ).aggregate(s=Sum("rows_deleted"))["s"]
            or 0
        )
        if gone_count != audited_rows:
            problems.append(f"{gone_count} row(s) gone but {audited_rows} audited")
        # Every gone row must have been eligible (older than the cutoff, not kept, not held now).
        eligible = P.eligible(shadow_spec, policy_id=run.policy_id, cutoff=run.cutoff)
        outside = _scalar(
            sql.SQL("SELECT count(*) FROM {} WHERE {} AND NOT ({})").format(
                P.table(shadow_spec), gone, eligible.sql
            ),
            eligible.params,
        )
        if outside:
            problems.append(
                f"{outside} row(s) outside the run's scope (newer, kept or held) are gone"
            )
    return problems
