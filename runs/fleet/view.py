"""The fleet as the pages read it: per target, whether it answers and each policy's latest run
there with its progress, read from that target's ledger (the record; the control database keeps
no copy); per policy, on how many of its targets it converged and which lag, and why.

No page waits on a target. Each target's ledger is read in the background, by a thread of a
small pool (``_READERS``) with a short statement timeout, and what it read is kept in this
process for a moment (``Reading``); a page shows the last reading and, when that is older than
``FRESH_S`` (or lacks a policy the page shows), starts a new read of that target and goes on
without it. So a page answers from memory whatever the targets do:

- a target noted unreachable on the registry is not connected to: its tile says so;
- a target without a reading yet (the first page of this process) says "reading…", and the
  fragment showing it asks again a second later;
- a target whose read has waited longer than ``SILENT_S`` (a hung server, a path that drops
  its packets: the connection waits up to its connect timeout, and a statement timeout is the
  server's, which a hung server never applies) says "does not answer"; its read goes on in
  the background and notes the failure on the registry when it ends.

One read per target at a time: however many pages ask, a target that does not answer keeps
one connection attempt waiting, not one per page. ``/metrics`` (a scrape, not a page) may wait
up to ``PAGE_WAIT_S`` for the fresh readings it started, so its gauges are of this scrape."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, InterfaceError, connection, connections, transaction
from django.utils import timezone

from retention.models import Policy
from runs import forecast
from runs.models import GuardSample, Run
from runs.progress import progress_for
from targets import connections as C
from targets.models import DEFAULT, Target

READ_TIMEOUT_MS = 500
FRESH_S = 2.0  # a reading this young is shown without reading the ledger again
SILENT_S = 1.0  # a read still waiting after this long: the target does not answer
SHOWN_S = 10.0  # a reading older than this is not shown as the target's state (too old)
PAGE_WAIT_S = 1.0  # the longest /metrics waits for the readings it started, all together
_READERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="fleet-read")
CONVERGED = (Run.State.DRAINED, Run.State.COUNTED)
LATEST, PAGE = "latest", "page"  # what is read of a target: policies' latest runs, its page


@dataclass
class _Read:
    """A read of a target in progress."""

    future: Future
    started: float  # time.monotonic()
    asked: frozenset[int]


@dataclass
class Reading:
    """What a read of a target found, and when it began."""

    found: object
    asked: frozenset[int]
    at: float  # time.monotonic() when the read began
    taken_at: datetime


# per (target, what): the read in progress and the last reading
_reads: dict[tuple[str, str], _Read] = {}
_readings: dict[tuple[str, str], Reading] = {}
_lock = threading.Lock()
_epoch = [0]  # bumped by ``forget``: a read begun before it keeps nothing


def forget() -> None:
    """Drop this process's readings (a test's targets are not the last test's)."""
    with _lock:
        _reads.clear()
        _readings.clear()
        _epoch[0] += 1


@dataclass
class Tile:
    name: str
    group: str = ""
    reference: str = ""
    reachable: bool = True
    reason: str = ""  # why it is not reachable
    since: object = None
    reading: bool = False  # no reading of it yet: being read
    covered: frozenset[int] = frozenset()  # the policies its reading covers
    taken_at: datetime | None = None  # when its reading was taken
    latest: dict = field(default_factory=dict)  # policy id -> its latest run's facts here
    page: dict | None = None  # its page's reading (``target_page``)


@contextlib.contextmanager
def _read_transaction(timeout_ms: int) -> Iterator[None]:
    """A transaction whose statements stop after ``timeout_ms`` (the server applies it)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT set_config('statement_timeout', %s, true)", [f"{timeout_ms}ms"])
        yield


def _latest_runs(policy_ids: list[int], *, with_progress: bool = False) -> dict[int, dict]:
    """Each policy's latest run in the database in place: one statement (and, with
    ``with_progress``, its progress: ``runs.progress``, the one model every surface reads).
    Without policies it still asks the database: whether it answers is a reading too."""
    with _read_transaction(READ_TIMEOUT_MS * (4 if with_progress else 1)):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT DISTINCT ON (policy_id) policy_id, id, run_key, state, state_reason,"
                " tick, finished_at, created_at FROM runs_run WHERE policy_id = ANY(%s)"
                " AND state <> 'superseded' ORDER BY policy_id, tick DESC, id DESC",
                [policy_ids],
            )
            cols = [c.name for c in cur.description]
            out = {row[0]: dict(zip(cols, row, strict=True)) for row in cur.fetchall()}
        if with_progress and out:
            progress = progress_for([r["id"] for r in out.values()], now=timezone.now())
            for run in out.values():
                run["progress"] = progress.get(run["id"])
        if with_progress:
            for policy in Policy.objects.filter(pk__in=list(out)):
                out[policy.pk]["overdue_s"] = _overdue_here(policy)
        return out


def _overdue_here(policy) -> int | None:
    """How far behind the policy's table in the database in place is (its oldest eligible
    row's age past its cutoff; ``runs.forecast``, cached there), or None when it cannot be
    measured now — never a reason to call the target unreadable."""
    try:
        with transaction.atomic():  # a savepoint: a failed measurement leaves the read whole
            return forecast.measured_here(policy).get("overdue_s")
    except DatabaseError:
        return None


def _target_page(_policy_ids: list[int]) -> dict:
    """A target's page as read on it: its latest runs with their progress and its guard's
    latest sample."""
    with _read_transaction(READ_TIMEOUT_MS * 4):
        runs = list(Run.objects.select_related("policy", "policy_version").order_by("-id")[:50])
        progress = progress_for(runs, now=timezone.now())
        return {
            "runs": [(run, progress.get(run.pk)) for run in runs],
            "guard": GuardSample.objects.order_by("-taken_at").first(),
        }


READS: dict[str, Callable[[list[int]], object]] = {
    LATEST: lambda ids: _latest_runs(ids, with_progress=True),
    PAGE: _target_page,
}


def _read_target(name: str, what: str, dsn: str, asked: frozenset[int], started: float) -> object:
    """In a reader thread: ``what`` of target ``name``, kept as its reading; a target that
    fails is noted on the registry here (no page waits for it)."""
    taken_at, epoch = timezone.now(), _epoch[0]
    try:
        for attempt in (1, 2):
            kept = C.has_session(name)
            try:
                with C.on(name, dsn=dsn):
                    found = READS[what](sorted(asked))
                break
            except (DatabaseError, InterfaceError, C.TargetError) as exc:
                C.close_all()  # this thread's connections to targets, opened anew next time
                if attempt == 1 and kept and not isinstance(exc, C.TargetError):
                    continue  # the session this thread kept may be the one that was lost
                # a new connection that failed: a second would wait its connect timeout again
                C.note_reachable(name, exc)
                raise
        with _lock:
            known = _readings.get((name, what))
            if epoch == _epoch[0] and (known is None or known.at <= started):
                _readings[(name, what)] = Reading(found, asked, started, taken_at)
        return found
    finally:
        connections.close_all()  # this thread's connection to the control database


def _start_read(name: str, what: str, dsn: str, wanted: frozenset[int]) -> _Read | None:
    """The read of ``name`` a page depends on: the one in progress if it covers ``wanted`` or
    has waited longer than ``SILENT_S`` (a target that does not answer keeps one reader, not
    one per page); None when the last reading is fresh and covers ``wanted``; else one
    started now."""
    key = (name, what)
    now = time.monotonic()
    with _lock:
        running = _reads.get(key)
        if running is not None and not running.future.done():
            if wanted <= running.asked or now - running.started > SILENT_S:
                return running
        reading = _readings.get(key)
        if reading is not None and now - reading.at < FRESH_S and wanted <= reading.asked:
            return running if running is not None and running.future.done() else None
        asked = wanted | (reading.asked if reading is not None else frozenset())
        future = _READERS.submit(_read_target, name, what, dsn, asked, now)
        _reads[key] = _Read(future, now, asked)
        return _reads[key]


def _settle(tile: Tile, what: str, read: _Read | None, wanted: frozenset[int]):
    """What the page shows of ``tile`` from its reading, without waiting: the reading's
    content (or None while there is none)."""
    now = time.monotonic()
    if read is not None and read.future.done() and read.future.exception() is not None:
        exc = read.future.exception()  # noted on the registry by the read
        tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
        return None
    if read is not None and not read.future.done() and now - read.started > SILENT_S:
        tile.reachable, tile.since = False, timezone.now()
        waited = now - read.started
        tile.reason = f"does not answer (its ledger's read has waited {waited:.1f} s)"
        return None
    with _lock:
        reading = _readings.get((tile.name, what))
    if reading is None or now - reading.at > SHOWN_S:
        tile.reading = True
        return None
    tile.covered, tile.taken_at = reading.asked & wanted, reading.taken_at
    tile.reading = not tile.covered and bool(wanted)
    return reading.found


def tiles(
    names: list[str], policy_ids: list[int], *, what: str = LATEST, wait_s: float = 0.0
) -> dict[str, Tile]:
    """Each target's tile from its last reading (``what``: the policies' latest runs, or its
    page). Never waits on a target unless ``wait_s`` (``/metrics``): then up to that long in
    all for the reads it started."""
    registry = {t.name: t for t in Target.objects.filter(name__in=names)}
    wanted = frozenset(policy_ids)
    out: dict[str, Tile] = {}
    reads: dict[str, _Read | None] = {}
    found: dict[str, object] = {}
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
        if name == DEFAULT:  # the control database itself: read in place
            try:
                found[name] = READS[what](sorted(wanted))
                tile.covered, tile.taken_at = wanted, timezone.now()
            except DatabaseError as exc:  # the tile says so
                tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
            continue
        try:
            dsn = C.dsn_from(row.dsn_env, row.dsn_file, name=name)
        except C.TargetError as exc:
            C.note_reachable(name, exc)
            tile.reachable, tile.reason, tile.since = False, C.first_line(exc), timezone.now()
            continue
        reads[name] = _start_read(name, what, dsn, wanted)
    if wait_s > 0:
        deadline = time.monotonic() + wait_s
        for read in reads.values():
            if read is not None:
                try:
                    read.future.exception(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    pass
    for name, read in reads.items():
        found[name] = _settle(out[name], what, read, wanted)
    for name, tile in out.items():
        if what == LATEST and tile.reachable and not tile.reading:
            latest = found.get(name) or {}
            tile.latest = {pid: latest[pid] for pid in tile.covered if pid in latest}
        elif what == PAGE:
            tile.page = found.get(name)
    return out


def fleet_of(
    policies: list[Policy], targets_by_policy: dict[int, list[str]], *, wait_s: float = 0.0
) -> dict[int, dict]:
    """Per policy over more than the control database: ``converged`` of ``total`` targets,
    ``laggards`` [(target, why)], ``reading`` (how many are being read) and ``targets``
    [{target, run (its latest run's facts and progress), why, reachable, reason, reading}]."""
    fleet_ids = [p.id for p in policies if targets_by_policy.get(p.id, [DEFAULT]) != [DEFAULT]]
    if not fleet_ids:
        return {}
    names = sorted({n for pid in fleet_ids for n in targets_by_policy[pid]})
    by_name = tiles(names, fleet_ids, wait_s=wait_s)
    out: dict[int, dict] = {}
    for pid in fleet_ids:
        names_here = targets_by_policy[pid]
        known = {n for n in names_here if by_name[n].reachable and pid in by_name[n].covered}
        runs = {n: by_name[n].latest.get(pid) for n in known}
        newest = max((r["tick"] for r in runs.values() if r), default=None)
        rows, laggards, converged, reading = [], [], 0, 0
        for n in names_here:
            tile, run = by_name[n], runs.get(n)
            being_read = tile.reachable and n not in known
            if not tile.reachable:
                why = f"unreachable: {tile.reason}"
            elif being_read:
                why = "reading…"
                reading += 1
            elif run is None:
                why = "no run yet"
            elif run["tick"] != newest:
                why = f"no run for the latest period (its latest: {run['run_key']})"
            elif run["state"] in CONVERGED:
                why = ""
            else:
                why = run["state"] + (f": {run['state_reason']}" if run["state_reason"] else "")
            converged += not why
            if why and not being_read:
                laggards.append((n, why))
            rows.append(
                {
                    "target": n,
                    "run": run,
                    "overdue_s": (run or {}).get("overdue_s"),
                    "why": why,
                    "reachable": tile.reachable,
                    "reason": tile.reason,
                    "reading": being_read,
                    "taken_at": tile.taken_at,
                }
            )
        out[pid] = {
            "converged": converged,
            "total": len(names_here),
            "laggards": laggards,
            "reading": reading,
            "targets": rows,
        }
    return out


def target_page(name: str) -> dict:
    """A target's page: its registry row, whether it answers, its guard's latest reading and
    its latest runs with their progress (``runs.progress``, read on the target) — from its
    last reading, never waiting on it (``reading`` while there is none yet)."""
    registry = Target.objects.filter(name=name).first()
    tile = tiles([name], [], what=PAGE)[name]
    page = tile.page if tile.reachable else None
    return {
        "tile": tile,
        "target": registry,
        "runs": page["runs"] if page else [],
        "guard": page["guard"] if page else None,
        "reading": tile.reachable and page is None,
    }


def targets_page() -> dict:
    names = C.all_names()
    found = list(tiles(names, []).values())
    return {"tiles": found, "reading": any(t.reading for t in found)}
