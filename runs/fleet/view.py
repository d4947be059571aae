"""The fleet as the pages read it: per target, whether it answers and each policy's latest run
there, read from that target's ledger (the record; the control database keeps no copy); per
policy, on how many of its targets it converged and which lag, and why.

A page never waits on a target noted unreachable (its tile says so, from the registry row); a
target not noted is read with a short statement timeout, and one that fails is noted and shown
unreachable."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from retention.models import Policy
from runs.models import GuardSample, Run
from runs.progress import progress_for
from targets import connections as C
from targets.models import DEFAULT, Target

READ_TIMEOUT_MS = 500
CONVERGED = (Run.State.DRAINED, Run.State.COUNTED)


@dataclass
class Tile:
    name: str
    group: str = ""
    reference: str = ""
    reachable: bool = True
    reason: str = ""  # why it is not reachable
    since: object = None
    latest: dict = field(default_factory=dict)  # policy id -> its latest run's facts here


def _latest_runs(policy_ids: list[int]) -> dict[int, dict]:
    """Each policy's latest run in the database in place: one statement."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT set_config('statement_timeout', %s, true)", [f"{READ_TIMEOUT_MS}ms"])
        cur.execute(
            "SELECT DISTINCT ON (policy_id) policy_id, id, run_key, state, state_reason, tick,"
            " finished_at, created_at FROM runs_run WHERE policy_id = ANY(%s)"
            " AND state <> 'superseded' ORDER BY policy_id, tick DESC, id DESC",
            [policy_ids],
        )
        cols = [c.name for c in cur.description]
        return {row[0]: dict(zip(cols, row, strict=True)) for row in cur.fetchall()}


def tiles(names: list[str], policy_ids: list[int]) -> dict[str, Tile]:
    registry = {t.name: t for t in Target.objects.filter(name__in=names)}
    out: dict[str, Tile] = {}
    for name in names:
        row = registry.get(name)
        tile = Tile(name)
        if row is not None:
            tile.group, tile.reference = row.group, row.reference
            if row.unreachable_since is not None:
                tile.reachable, tile.reason = False, row.unreachable_reason
                tile.since = row.unreachable_since
                out[name] = tile
                continue
        elif name != DEFAULT:
            tile.reachable, tile.reason = False, "not registered"
            out[name] = tile
            continue
        try:
            with C.on(name):
                tile.latest = _latest_runs(policy_ids)
        except (DatabaseError, C.TargetError) as exc:  # the tile says so, the page goes on
            C.close_all()
            C.note_reachable(name, exc)
            tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
        out[name] = tile
    return out


def fleet_of(policies: list[Policy], targets_by_policy: dict[int, list[str]]) -> dict[int, dict]:
    """Per policy over more than the control database: ``converged`` of ``total`` targets,
    ``laggards`` [(target, why)] and ``targets`` [(target, state, run id)]."""
    fleet_ids = [p.id for p in policies if targets_by_policy.get(p.id, [DEFAULT]) != [DEFAULT]]
    if not fleet_ids:
        return {}
    names = sorted({n for pid in fleet_ids for n in targets_by_policy[pid]})
    by_name = tiles(names, fleet_ids)
    out: dict[int, dict] = {}
    for pid in fleet_ids:
        names_here = targets_by_policy[pid]
        runs = {n: by_name[n].latest.get(pid) for n in names_here if by_name[n].reachable}
        newest = max((r["tick"] for r in runs.values() if r), default=None)
        rows, laggards, converged = [], [], 0
        for n in names_here:
            tile, run = by_name[n], runs.get(n)
            if not tile.reachable:
                why = f"unreachable: {tile.reason}"
            elif run is None:
                why = "no run yet"
            elif run["tick"] != newest:
                why = f"no run for the latest period (its latest: {run['run_key']})"
            elif run["state"] in CONVERGED:
                why = ""
            else:
                why = run["state"] + (f": {run['state_reason']}" if run["state_reason"] else "")
            converged += not why
            if why:
                laggards.append((n, why))
            rows.append({"target": n, "run": run, "why": why, "reachable": tile.reachable})
        out[pid] = {
            "converged": converged,
            "total": len(names_here),
            "laggards": laggards,
            "targets": rows,
        }
    return out


def target_page(name: str) -> dict:
    """A target's page: its registry row, whether it answers, its guard's latest reading and
    its latest runs with their progress (``runs.progress``, read on the target)."""
    registry = Target.objects.filter(name=name).first()
    tile = tiles([name], [])[name]
    context: dict = {"tile": tile, "target": registry, "runs": [], "guard": None}
    if not tile.reachable:
        return context
    try:
        with C.on(name):
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [f"{READ_TIMEOUT_MS * 4}ms"]
                )
                runs = list(
                    Run.objects.select_related("policy", "policy_version").order_by("-id")[:50]
                )
                progress = progress_for(runs, now=timezone.now())
                context["runs"] = [(run, progress.get(run.pk)) for run in runs]
                context["guard"] = GuardSample.objects.order_by("-taken_at").first()
    except (DatabaseError, C.TargetError) as exc:  # the page says so and goes on
        C.close_all()
        C.note_reachable(name, exc)
        tile.reachable, tile.reason = False, C.first_line(exc)
        context["runs"] = []
    return context


def targets_page() -> dict:
    names = C.all_names()
    return {"tiles": list(tiles(names, []).values())}
