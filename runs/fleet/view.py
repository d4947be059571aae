"""The fleet as the pages read it: per target, whether it answers and each policy's latest run
there, read from that target's ledger (the record; the control database keeps no copy); per
policy, on how many of its targets it converged and which lag, and why.

A page never waits on a target noted unreachable (its tile says so, from the registry row); the
targets not noted are read at once, each by a thread of a small pool (``_READERS``) with a
short statement timeout, and the page waits for them at most ``PAGE_WAIT_S`` in all: a target
that has not answered by then (a hung server, a path that drops its packets: the connection
itself waits up to its connect timeout, and a statement timeout is the server's, which a hung
server never applies) is shown as not answering while its read goes on in the background; one
that fails is noted on the registry and shown unreachable. One read per target at a time: a
page that finds the read of a target an earlier page stopped waiting for still waiting does
not start another, nor wait for it: only the first page after a target stops answering waits,
at most ``PAGE_WAIT_S``."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, connection, connections, transaction
from django.utils import timezone

from retention.models import Policy
from runs.models import GuardSample, Run
from runs.progress import progress_for
from targets import connections as C
from targets.models import DEFAULT, Target

READ_TIMEOUT_MS = 500
PAGE_WAIT_S = 1.0  # the longest a page waits for the targets' ledgers, all of them together
_READERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="fleet-read")
# per target, its read in progress: (future, when it began, the policies it asked for)
_reading: dict[str, tuple[Future, float, set[int]]] = {}
_reading_lock = threading.Lock()
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


def _read_target(name: str, dsn: str, policy_ids: list[int]) -> dict[int, dict]:
    """In a reader thread: each policy's latest run on ``name``; a target that fails is noted
    on the registry here (the page may have stopped waiting for it)."""
    for attempt in (1, 2):
        try:
            with C.on(name, dsn=dsn):
                return _latest_runs(policy_ids)
        except (DatabaseError, InterfaceError, C.TargetError) as exc:
            C.close_all()  # this thread's connections to targets, opened anew next time
            if attempt == 1 and not isinstance(exc, C.TargetError):
                continue  # the session this thread kept may be the one that was lost
            try:
                C.note_reachable(name, exc)
            finally:
                connections.close_all()  # this thread's connection to the control database
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _start_read(name: str, dsn: str, policy_ids: list[int]) -> tuple[Future, float]:
    """The read of ``name`` in progress and when it began: the one still running if it asks
    for these policies or has waited longer than a page would (a target that does not answer
    keeps one reader, not one per page), else one started now."""
    with _reading_lock:
        running = _reading.get(name)
        if running is not None and not running[0].done():
            future, started, asked = running
            if set(policy_ids) <= asked or time.monotonic() - started > PAGE_WAIT_S:
                return future, started
        future = _READERS.submit(_read_target, name, dsn, policy_ids)
        _reading[name] = (future, time.monotonic(), set(policy_ids))
        return future, _reading[name][1]


def tiles(names: list[str], policy_ids: list[int]) -> dict[str, Tile]:
    registry = {t.name: t for t in Target.objects.filter(name__in=names)}
    out: dict[str, Tile] = {}
    reads: dict[str, tuple[Future, float, list[int]]] = {}
    for name in names:
        row = registry.get(name)
        tile = out[name] = Tile(name)
        if row is not None:
            tile.group, tile.reference = row.group, row.reference
            if row.unreachable_since is not None:
                tile.reachable, tile.reason = False, row.unreachable_reason
                tile.since = row.unreachable_since
                continue
        elif name != DEFAULT:
            tile.reachable, tile.reason = False, "not registered"
            continue
        if name == DEFAULT:
            try:
                tile.latest = _latest_runs(policy_ids)
            except DatabaseError as exc:  # the control database itself: the tile says so
                tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
            continue
        try:
            dsn = C.dsn_from(row.dsn_env, row.dsn_file, name=name)
        except C.TargetError as exc:
            C.note_reachable(name, exc)
            tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
            continue
        future, started = _start_read(name, dsn, policy_ids)
        reads[name] = (future, started, policy_ids)
    deadline = time.monotonic() + PAGE_WAIT_S
    for name, (future, started, wanted) in reads.items():
        tile = out[name]
        # a read an earlier page already stopped waiting for is not waited for again
        given_up = time.monotonic() - started > PAGE_WAIT_S
        wait = 0.0 if given_up else max(0.0, deadline - time.monotonic())
        try:
            latest = future.result(timeout=wait)
        except FutureTimeout:  # the tile says so, the page goes on; the read goes on
            waited = time.monotonic() - started
            tile.reachable, tile.since = False, timezone.now()
            tile.reason = f"does not answer (its ledger's read has waited {waited:.1f} s)"
            continue
        except (DatabaseError, InterfaceError, C.TargetError) as exc:  # noted by the read
            tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
            continue
        # a read a previous page started may have asked for other policies
        tile.latest = {pid: latest[pid] for pid in wanted if pid in latest}
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
