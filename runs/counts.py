"""Count runs' figures: the one home of what a count run found, and of the inflow two
successive count runs show (docs/policies.md, "Rolling out a policy").

A count run (``rollout = "count"``) plans chunks like a full run and counts, chunk by chunk,
what each chunk's DELETE would remove (``predicate.count_chunk``); each chunk keeps its counts
(``Chunk.counts``). Every surface — ``retention status``, the run page, the approval card,
the policy page, the manifest, the CSV, the drain window — reads the totals from here.
"""

from __future__ import annotations

from django.db import connection
from django.utils import timezone

from core.formatting import natural_key
from retention.models import PolicyVersion
from runs.models import Chunk, Run
from runs.progress import progress_for

MAX_SHOWN = 12  # tenants and months a page lists (the rest summed as "others")


def _empty() -> dict:
    return {"rows": 0, "kept": 0, "held": 0, "cascade": 0, "chunks": 0, "tenants": {}, "ages": {}}


def count_totals(run: Run) -> dict:
    """A count run's totals over its counted chunks: ``rows`` (what a full run of the same
    cutoff would delete), ``kept`` (by keep rules), ``held`` (deferred by legal holds),
    ``cascade`` (deferred: a cascade would reach protected rows), ``chunks`` counted, and
    rows per tenant and per month (``"YYYY-MM"`` in the policy's timezone), summed by the
    database. Zeros for a run that is not a count run or has counted nothing yet."""
    out = _empty()
    if not run.counts_only:
        return out
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), coalesce(sum((counts->>'rows')::bigint), 0),"
            " coalesce(sum((counts->>'kept')::bigint), 0),"
            " coalesce(sum((counts->>'held')::bigint), 0),"
            " coalesce(sum((counts->>'cascade')::bigint), 0)"
            " FROM runs_chunk WHERE run_id = %s AND state = %s AND counts IS NOT NULL",
            [run.pk, Chunk.State.DONE.value],
        )
        out["chunks"], out["rows"], out["kept"], out["held"], out["cascade"] = (
            int(v) for v in cur.fetchone()
        )
        for name in ("tenants", "ages"):
            cur.execute(
                "SELECT e.key, sum(e.value::bigint) FROM runs_chunk c,"
                " jsonb_each_text(c.counts->%s) AS e"
                " WHERE c.run_id = %s AND c.state = %s AND c.counts IS NOT NULL"
                " GROUP BY 1",
                [name, run.pk, Chunk.State.DONE.value],
            )
            out[name] = {k: int(v) for k, v in cur.fetchall()}
    return out


def rows_counted(run: Run) -> int | None:
    """What a count run found a full run would delete (so far, while it counts); None for a
    run that is not a count run."""
    if not run.counts_only:
        return None
    return count_totals(run)["rows"]


def shown(mapping: dict, *, by_key: bool = False) -> list[tuple[str, int]]:
    """Per-tenant or per-month rows as a page lists them: the largest (or, ``by_key``, in
    order) first, at most ``MAX_SHOWN``, the rest as one ``others`` line."""
    items = sorted(
        mapping.items(),
        key=lambda kv: natural_key(kv[0]) if by_key else (-kv[1], natural_key(kv[0])),
    )
    if len(items) <= MAX_SHOWN + 2:  # an "others" line for one or two would save nothing
        return items
    head, rest = items[:MAX_SHOWN], items[MAX_SHOWN:]
    return [*head, (f"{len(rest)} others", sum(n for _k, n in rest))]


def last_counts(policy, *, before: Run | None = None, limit: int = 2) -> list[Run]:
    """The policy's newest counted runs (newest first), at most ``limit``."""
    runs = Run.objects.filter(policy=policy, state=Run.State.COUNTED)
    if before is not None:
        runs = runs.filter(tick__lt=before.tick)
    return list(runs.select_related("policy_version").order_by("-tick", "-id")[:limit])


def count_inflow(policy) -> dict | None:
    """What two successive count runs of the policy show: their counts, and the inflow — rows
    that became eligible per day between their cutoffs (count runs delete nothing, so the
    difference is what arrived past the cutoff, net of holds and keep rules). None with fewer
    than two counted runs."""
    runs = last_counts(policy)
    if len(runs) < 2:
        return None
    newer, older = runs
    a, b = rows_counted(older), rows_counted(newer)
    days = (newer.cutoff - older.cutoff).total_seconds() / 86400
    return {
        "older": older.run_key,
        "newer": newer.run_key,
        "older_rows": a,
        "newer_rows": b,
        "days": days,
        "inflow_per_day": round((b - a) / days) if days > 0 else None,
    }


MAX_VERSIONS = 10  # versions the policy page's rollout history lists
MAX_RUNS = 10  # runs per version it lists


def _count_facts(run: Run) -> dict:
    totals = count_totals(run)
    return {
        "run_key": run.run_key,
        "run_id": run.pk,
        "version": run.policy_version.number,
        "cutoff": run.cutoff,
        "finished_at": run.finished_at,
        "rows": totals["rows"],
        "kept": totals["kept"],
        "held": totals["held"],
        "cascade": totals["cascade"],
    }


def rollout_report(policy) -> dict:
    """What the approval card and the policy page show of a policy's rollout
    (``retention.signals.rollout_sources``): ``last_count`` — the newest counted run's figures
    (None without one) — ``inflow`` (``count_inflow``), and ``history``: per approved version,
    newest first, its stage and its runs (state, rows deleted or counted)."""
    counted = last_counts(policy, limit=1)
    versions = list(
        PolicyVersion.objects.filter(policy=policy)
        .exclude(decided_at__isnull=True)
        .filter(state__in=(PolicyVersion.State.APPROVED, PolicyVersion.State.SUPERSEDED))
        .order_by("-number")[:MAX_VERSIONS]
    )
    runs_of = {v.pk: [] for v in versions}
    for run in (
        Run.objects.filter(policy_version__in=versions)
        .select_related("policy_version", "policy")
        .order_by("-tick", "-id")
    ):
        if len(runs_of[run.policy_version_id]) < MAX_RUNS:
            runs_of[run.policy_version_id].append(run)
    shown = [r for rs in runs_of.values() for r in rs]
    progress = progress_for(shown, now=timezone.now()) if shown else {}
    history = []
    for version in versions:
        spec = version.parsed
        history.append(
            {
                "version": version.number,
                "state": version.state,
                "approved_at": version.decided_at,
                "rollout": spec.rollout,
                "slice": spec.slice,
                "runs": [
                    {
                        "run_id": run.pk,
                        "run_key": run.run_key,
                        "state": run.state,
                        "rollout": run.rollout,
                        "slice_bound": run.slice_bound,
                        "rows_counted": rows_counted(run),
                        "rows_deleted": progress[run.pk].rows_deleted if run.pk in progress else 0,
                    }
                    for run in runs_of[version.pk]
                ],
            }
        )
    return {
        "last_count": _count_facts(counted[0]) if counted else None,
        "inflow": count_inflow(policy),
        "history": history,
    }
