"""How far each run has come: the one read model every surface shows.

The overview, the run page, ``retention status``, the evidence manifest and /metrics all
read ``progress_for``; none counts chunks or audit rows itself, so they cannot disagree.
A fixed number of grouped queries serves any number of runs: the runs themselves, chunks
by (run, tenant, state), audit rows by (run, tenant), the latest throttle reason per run (a pending chunk throttled within one
lease budget)
and the broker backlog.

The numbers are honest about being estimates:

- ``rows_deleted`` is exact (the sum over audit records).
- A chunk's planned size is the number of keys in its range when the planner walked the key
  index (runs/engine/planner.py): what it can delete *at most* — some of those rows are young, kept
  by a keep rule or held. ``rows_planned``, ``rows_outstanding`` (chunks still pending or
  dead-lettered) and ``rows_pending`` are sums of those upper bounds, shown as "up to".
- ``rows_expected`` is the run's total as best known: the eligible count taken at admission
  (``Run.expected_rows``), never below what has been deleted and — once the planner is done —
  never above what the chunks can still delete (``rows_deleted + rows_outstanding``).
  ``expected_bound`` says how to read it: "~" (the admission count), "at least" (the count
  was capped by the blast-radius guard, or more has been deleted than it counted) or "up
  to" (what the planned chunks can delete at most: there is no admission count, or the
  count is out of their reach). Without an admission count there is no total while the
  planner is still walking, and ``rows_expected`` is 0.
- ``percent`` is ``rows_deleted / rows_expected`` (100 only when drained, 0 when there is no
  total); ``eta_range_s`` is when the rows still to go are done, as a range: at the run's
  pace over the last ten minutes and at its pace over the whole run — each per second the
  run was admitted (``ADMITTED_GAP``) — at least ±12% wide; ``eta_s`` its geometric middle;
  both only for an active run.

Every number is an ``int`` or a ``float``: database sums (``numeric`` in PostgreSQL, a
``Decimal`` in Python) are converted here, so no caller mixes the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Count, F, Min, Q, Sum
from psycopg import sql

from core.formatting import natural_key
from retention.models import KillSwitch
from runs.models import AuditRecord, Chunk, Run

RATE_WINDOW = timedelta(minutes=10)
ABOUT, AT_LEAST, UP_TO = "~", "at least", "up to"


@dataclass(frozen=True)
class BrokerBacklog:
    """django-q2 messages waiting in the ORM queue (lock in the past = not yet taken)."""

    waiting: int
    oldest_age_s: float | None


@dataclass
class TenantProgress:
    tenant: str
    chunks: int = 0  # not counting split chunks (their children carry the rows)
    done: int = 0
    dead: int = 0
    planned: int = 0  # keys in the tenant's chunks when planned: up to this many rows
    rows_deleted: int = 0
    rows_outstanding: int = 0  # up to (keys of its pending and dead-lettered chunks)

    @property
    def percent(self) -> int:
        """Deleted of deleted plus what its open chunks can delete at most: never more than
        the tenant's real progress."""
        return _percent(self.rows_deleted, self.rows_deleted + self.rows_outstanding)


@dataclass
class RunProgress:
    run_id: int
    run_key: str
    policy_slug: str
    state: str
    planner_done: bool
    chunks: dict[str, int] = field(default_factory=lambda: {s: 0 for s in Chunk.State.values})
    retries: int = 0
    admissible: int = 0  # pending chunks whose not_before has passed, unless the run is stopped
    stopped: bool = False  # not active, its policy paused or the kill switch on: none admitted
    oldest_pending: datetime | None = None
    queue_age_s: float | None = None
    rows_planned: int = 0  # up to: keys in the run's chunks when planned (not split ones)
    rows_deleted: int = 0
    rows_outstanding: int = 0  # up to: keys of pending and dead-lettered chunks
    rows_pending: int = 0  # up to: keys of pending chunks
    rows_expected: int = 0  # 0: no total known yet
    expected_bound: str = "~"  # "~" | "at least" | "up to": how to read rows_expected
    admission_count: int | None = None  # eligible rows counted at admission (may be capped)
    admission_capped: bool = False  # the count reached the blast-radius cap (run held)
    counts_only: bool = False  # a count run: its done chunks write no audit record
    audit_records: int = 0
    first_commit: datetime | None = None
    last_commit: datetime | None = None
    last_commit_age_s: float | None = None
    rate_per_s: float | None = None  # rows per second admitted, over the last ten minutes
    admitted_s: float = 0.0  # seconds the run was admitted and working, over the whole run
    recent_admitted_s: float = 0.0  # the same over the last ten minutes
    percent: int = 0
    eta_s: float | None = None  # the middle of the range below (for /metrics and --json)
    eta_range_s: tuple[float, float] | None = None  # (soonest, latest): what the page shows
    throttle_reason: str = ""
    tenants: list[TenantProgress] = field(default_factory=list)
    broker: BrokerBacklog | None = None

    @property
    def expected_is_lower_bound(self) -> bool:
        return self.expected_bound == AT_LEAST

    @property
    def expected_is_upper_bound(self) -> bool:
        return self.expected_bound == UP_TO

    @property
    def chunks_total(self) -> int:
        return sum(n for s, n in self.chunks.items() if s != Chunk.State.SPLIT)

    @property
    def chunks_done(self) -> int:
        return self.chunks[Chunk.State.DONE]

    def as_dict(self) -> dict:
        """The figures as plain JSON-ready values (the CLI's and the manifest's shape)."""
        return {
            "chunks": dict(self.chunks),
            "chunks_done": self.chunks_done,
            "chunks_total": self.chunks_total,
            "retries": self.retries,
            "admissible": self.admissible,
            "rows_deleted": self.rows_deleted,
            "rows_planned_up_to": self.rows_planned,
            "rows_expected": self.rows_expected,
            "expected_bound": self.expected_bound,
            "percent": self.percent,
            "eta_s": None if self.eta_s is None else round(self.eta_s),
            "eta_range_s": None
            if self.eta_range_s is None
            else [round(x) for x in self.eta_range_s],
            "rate_per_s": None if self.rate_per_s is None else round(self.rate_per_s, 1),
        }


def _int(value) -> int:
    return int(value or 0)


def _age(now: datetime, then: datetime | None) -> float | None:
    return (now - then).total_seconds() if then else None


def _percent(done: int, expected: int) -> int:
    if expected <= 0:
        return 0
    return max(0, min(100, (100 * done) // expected))


def broker_backlog(now: datetime) -> BrokerBacklog:
    from django_q.models import OrmQ  # django-q2's models need its app registry ready

    row = OrmQ.objects.filter(lock__lte=now).aggregate(n=Count("id"), oldest=Min("lock"))
    return BrokerBacklog(waiting=_int(row["n"]), oldest_age_s=_age(now, row["oldest"]))


UNREAD = object()


def progress_for(
    runs: Iterable[int | Run],
    *,
    now: datetime,
    broker: BrokerBacklog | None = None,
    kill_switch=UNREAD,
    remembered: bool = True,
) -> dict[int, RunProgress]:
    """Progress of each run in ``runs`` (ids or loaded ``Run`` rows with their policy; unknown
    ids are left out), from at most six grouped queries: the runs (only when given ids),
    chunks, audit records, throttle reasons, the broker backlog (unless ``broker`` is
    passed by a caller that read it already) and the kill switch (unless ``kill_switch``,
    the global ``KillSwitch`` row or None, is passed). A stopped run (not active, its policy
    paused, the kill switch on) has no admissible chunk, whatever their ``not_before``.
    ``remembered=False``: every sum read from the records, nothing read from or written to the
    shared cache — for the engine's own processes, whose login has no access to the cache the
    pages trust (database/grants.py).

    Every figure is read in one snapshot (a repeatable-read transaction, unless the caller is
    in a transaction of its own already): a chunk that commits while they are read is either
    done in all of them or pending in all of them, never missing from both — so a run's chunk
    count and expected total do not dip for one reading (131 → 130 → 131)."""
    given = list(runs)
    if not given:
        return {}
    with _one_snapshot():
        out, remember = _read_progress(given, now, broker, kill_switch, remembered)
    if remember:
        cache.set_many(remember, timeout=None)
    return out


@contextmanager
def _one_snapshot():
    if connection.in_atomic_block:
        yield  # the caller's transaction: its isolation is its own
        return
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _read_progress(given, now, broker, kill_switch, remembered):
    broker = broker if broker is not None else broker_backlog(now)
    out: dict[int, RunProgress] = {}
    loaded = [r for r in given if isinstance(r, Run)]
    ids_only = [r for r in given if not isinstance(r, Run)]
    rows = [
        {
            "id": r.pk, "run_key": r.run_key, "policy__slug": r.policy.slug, "state": r.state,
            "planner_done": r.planner_done, "expected_rows": r.expected_rows,
            "started_at": r.started_at, "held_at": r.held_at, "policy__paused": r.policy.paused,
            "rollout": r.rollout,
        }
        for r in loaded
    ]  # fmt: skip
    if ids_only:
        rows += Run.objects.filter(pk__in=ids_only).values(
            "id", "run_key", "policy__slug", "state", "planner_done", "expected_rows", "started_at",
            "held_at", "policy__paused", "rollout",
        )  # fmt: skip
    if kill_switch is UNREAD:
        kill_switch = KillSwitch.objects.filter(name="global").first()
    switch_on = kill_switch is not None and kill_switch.on
    admitted: dict[int, int | None] = {}
    started: dict[int, datetime | None] = {}
    for row in rows:
        out[row["id"]] = RunProgress(
            run_id=row["id"],
            run_key=row["run_key"],
            policy_slug=row["policy__slug"],
            state=row["state"],
            planner_done=row["planner_done"],
            stopped=row["state"] != Run.State.ACTIVE or row["policy__paused"] or switch_on,
            admission_count=row["expected_rows"],
            # held for confirmation: the count stopped at the blast-radius cap (runs.actions.admit)
            admission_capped=row["held_at"] is not None and row["expected_rows"] is not None,
            counts_only=row["rollout"] == "count",
            broker=broker,
        )
        admitted[row["id"]] = row["expected_rows"]
        started[row["id"]] = row["started_at"]
    ids = list(out)
    tenants: dict[int, dict[str, TenantProgress]] = {rid: {} for rid in ids}
    recent = now - RATE_WINDOW
    # what earlier readings remembered (runs.progress's two cache entries per run), read at once
    finished = [rid for rid, p in out.items() if p.state in Run.TERMINAL]
    known = (
        cache.get_many(
            [AUDIT_TALLY_KEY.format(rid) for rid in ids]
            + [_chunk_sums_key(out[rid], started[rid]) for rid in finished]
        )
        if remembered
        else {}
    )
    tallies, remember = audit_tallies(ids, recent, known=known)
    chunk_rows, remember_chunks = _chunk_sums(out, tallies, started, now, known=known)
    to_remember = {**remember, **remember_chunks} if remembered else {}

    for row in chunk_rows:
        p = out[row["run_id"]]
        state, n, planned = row["state"], _int(row["n"]), _int(row["planned"])
        p.chunks[state] += n
        p.retries += _int(row["retries"])
        if state == Chunk.State.PENDING:
            p.admissible += 0 if p.stopped else _int(row["ready"])
            p.rows_pending += planned
            if p.oldest_pending is None or row["oldest"] < p.oldest_pending:
                p.oldest_pending = row["oldest"]
        if state == Chunk.State.SPLIT:
            continue
        p.rows_planned += planned
        t = tenants[p.run_id].setdefault(row["tenant"], TenantProgress(row["tenant"]))
        t.chunks += n
        t.planned += planned
        if state == Chunk.State.DONE:
            t.done += n
        elif state == Chunk.State.DEAD:
            t.dead += n
            t.rows_outstanding += planned
            p.rows_outstanding += planned
        elif state == Chunk.State.PENDING:
            t.rows_outstanding += planned
            p.rows_outstanding += planned

    for run_id, tally in tallies.items():
        p = out[run_id]
        for name, (rows, n, first, last) in tally["tenants"].items():
            p.rows_deleted += rows
            p.audit_records += n
            p.first_commit = min(filter(None, (p.first_commit, first)), default=None)
            p.last_commit = max(filter(None, (p.last_commit, last)), default=None)
            t = tenants[run_id].setdefault(name, TenantProgress(name))
            t.rows_deleted += rows  # chunks across tenants: moved to their tenants below
        # A chunk across tenants (key-range geometry) records its rows per tenant: they move
        # from the audit row's own tenant to the tenants named in tenant_rows.
        for name, rows in tally["moved"].items():
            t = tenants[run_id].setdefault(name, TenantProgress(name))
            t.rows_deleted += rows
        p.admitted_s = float(tally.get("admitted_s", 0.0))
        p.recent_admitted_s = tally["recent_admitted_s"]
        if tally["recent_rows"]:
            p.rate_per_s = float(tally["recent_rows"])

    # A reason read only while the back-off is still in force would vanish a few seconds after
    # each throttle; one lease budget back, the surfaces keep saying why the run is held.
    throttled_since = now - timedelta(seconds=settings.RETENTION["LEASE_BUDGET_S"])
    for run_id, reason in (
        Chunk.objects.throttled(throttled_since)
        .filter(run_id__in=ids)
        .order_by("run_id", "-not_before")
        .distinct("run_id")
        .values_list("run_id", "throttle_reason")
    ):
        out[run_id].throttle_reason = reason

    for p in out.values():
        # natural order: tenant 2 before tenant 10 (a numeric tenant column), stable
        p.tenants = sorted(tenants[p.run_id].values(), key=lambda t: natural_key(t.tenant))
        p.queue_age_s = _age(now, p.oldest_pending)
        p.last_commit_age_s = _age(now, p.last_commit)
        _derive(p, admitted[p.run_id], started[p.run_id], now)
    return out, to_remember


CHUNK_SUMS_KEY = "progress:chunk-sums:v1:{}"


def _chunk_sums_key(p: RunProgress, started: datetime | None) -> str:
    when = started.isoformat() if started else "-"
    return CHUNK_SUMS_KEY.format(f"{p.run_id}:{p.run_key}:{when}:{p.state}")


def _chunk_sums(
    out: dict[int, RunProgress],
    tallies: dict[int, dict],
    started: dict,
    now: datetime,
    *,
    known: dict,
) -> tuple[list[dict], dict]:
    """Chunks by (run, tenant, state): count, planned keys, retries, the oldest created and
    how many are due (``not_before`` passed); and the cache entries to write.

    A finished run's chunks no longer change (cancelling one fences the chunks in flight
    first), so its sums are remembered with its state and the last audit record its trail's
    sums reach (``tallies``), and read back from ``known`` (what the cache held) while both
    still hold: a chunk that committed after all writes a record, and its run is counted
    again. An open run's chunks are counted each time."""
    rows: list[dict] = []
    counted = []
    for run_id, p in out.items():
        kept = known.get(_chunk_sums_key(p, started[run_id])) if p.state in Run.TERMINAL else None
        tally = tallies[run_id]
        if (
            isinstance(kept, dict)
            and kept.get("seq") == tally["seq"]
            and kept.get("hash") == tally["hash"]
        ):
            rows += kept["rows"]
        else:
            counted.append(run_id)
    if not counted:
        return rows, {}
    # done chunks from the audit sums (one record per done chunk); the others counted here,
    # a few per run (the planner's window), through index chunk_run_state
    fresh = [
        {"run_id": run_id, "tenant": name, "state": Chunk.State.DONE.value, "n": n,
         "planned": planned, "retries": retries, "oldest": None, "ready": 0}
        for run_id in counted
        for name, (n, planned, retries) in tallies[run_id].get("done", {}).items()
    ]  # fmt: skip
    not_done = [s for s in Chunk.State.values if s != Chunk.State.DONE]
    # a count run's done chunks write no audit record: they are counted here too
    counting = [run_id for run_id in counted if out[run_id].counts_only]
    fresh += list(
        Chunk.objects.filter(
            Q(run_id__in=counted, state__in=not_done)
            | Q(run_id__in=counting, state=Chunk.State.DONE)
        )
        .values("run_id", "tenant", "state")
        .annotate(
            n=Count("*"),  # not "id": the covering index chunk_run_state holds every column read
            planned=Sum("planned_rows"),
            retries=Sum(F("attempts") - 1, filter=Q(attempts__gt=1)),
            oldest=Min("created_at"),
            ready=Count("id", filter=Q(not_before__lte=now)),
        )
        .order_by()
    )
    remember = {}
    for run_id in counted:
        p = out[run_id]
        if p.state in Run.TERMINAL:
            remember[_chunk_sums_key(p, started[run_id])] = {
                "seq": tallies[run_id]["seq"], "hash": tallies[run_id]["hash"], "rows": [],
            }  # fmt: skip
    for row in fresh:
        row["planned"], row["retries"] = _int(row["planned"]), _int(row["retries"])
        entry = remember.get(_chunk_sums_key(out[row["run_id"]], started[row["run_id"]]))
        if entry is not None:
            entry["rows"].append(row)
    return rows + fresh, remember


# Each run's audit records after the chain_seq its remembered sums reach, read in one
# statement (one snapshot): a range of index audit_run per run. Rows: ("sum", run, tenant,
# rows, records, first, last), ("moved", run, tenant, rows), ("done", run, chunk tenant, planned
# keys, chunks, -, -, retries) — a chunk is done only in the transaction that writes its one
# audit record (runs.engine.worker._finish, partitions), and stays done — and ("top", run,
# chain_seq, hash).
# one branch per run, its values written in (constants: the planner picks index audit_run
# for a run's few new records; with parameters it guessed a third of the trail and scanned it);
# each new record's chunk looked up by its key (a lateral subquery that is not flattened, so
# not a hash join over every chunk)
_NEWER_BRANCH = sql.SQL(
    "SELECT {run}::bigint AS run_id, a.tenant, a.rows_deleted, a.committed_at, a.chain_seq,"
    " a.hash, a.tenant_rows, a.chunk_id, a.started_at FROM runs_auditrecord a"
    " WHERE a.run_id = {run} AND a.chain_seq > {seq}"
)
_LAST_SEQ = (
    "SELECT k.run_id, (SELECT max(a.chain_seq) FROM runs_auditrecord a WHERE a.run_id = k.run_id)"
    " FROM unnest(%s::bigint[]) AS k(run_id)"
)
_NEWER = sql.SQL("""
WITH newer AS ({branches})
SELECT 'sum', run_id, tenant, sum(rows_deleted), count(*), min(committed_at),
       max(committed_at), NULL::bigint, NULL::text
FROM newer GROUP BY run_id, tenant
UNION ALL
SELECT 'moved', run_id, tenant, sum(rows), NULL, NULL, NULL, NULL, NULL FROM (
  SELECT n.run_id, kv.key AS tenant, kv.value::bigint AS rows
  FROM newer n CROSS JOIN jsonb_each_text(n.tenant_rows) AS kv WHERE n.tenant_rows IS NOT NULL
  UNION ALL
  SELECT run_id, tenant, -rows_deleted FROM newer WHERE tenant_rows IS NOT NULL
) moved GROUP BY run_id, tenant
UNION ALL
SELECT 'done', n.run_id, c.tenant, sum(c.planned_rows), count(*), NULL, NULL,
       coalesce(sum(c.attempts - 1) FILTER (WHERE c.attempts > 1), 0), NULL
FROM newer n CROSS JOIN LATERAL (
  SELECT c.tenant, c.planned_rows, c.attempts FROM runs_chunk c
  WHERE c.id = n.chunk_id AND c.state = 'done' OFFSET 0
) c
GROUP BY n.run_id, c.tenant
UNION ALL
SELECT 'busy', run_id, NULL, sum(extract(epoch FROM busy)), NULL, NULL, NULL, NULL, NULL FROM (
  SELECT run_id, {busy} AS busy FROM (
    SELECT run_id, started_at, committed_at,
           lag(committed_at) OVER (PARTITION BY run_id ORDER BY committed_at, chain_seq) AS prev
    FROM newer
  ) ordered
) b GROUP BY run_id
UNION ALL
(SELECT DISTINCT ON (run_id) 'top', run_id, NULL, NULL, NULL, NULL, NULL, chain_seq, hash
 FROM newer ORDER BY run_id, chain_seq DESC)
""")


# A chunk's share of the time its run was admitted: from the previous commit when its
# transaction began within ADMITTED_GAP of it (the lease's own overhead between chunks, or
# another worker's chunk overlapping it), else from its own start — a longer gap is time the
# run was not admitted (paused, the kill switch on, the guard throttling it to zero, waiting
# for a worker), and counts for nothing.
ADMITTED_GAP = timedelta(seconds=2)
_BUSY = sql.SQL(
    "CASE WHEN prev IS NOT NULL AND started_at - prev <= {gap} THEN committed_at - prev"
    " ELSE committed_at - greatest(started_at, prev) END"
).format(gap=sql.Literal(ADMITTED_GAP))
_RECENT = sql.SQL("""
SELECT run_id, sum(rows_deleted), sum(extract(epoch FROM {busy})) FROM (
  SELECT run_id, rows_deleted, started_at, committed_at,
         lag(committed_at) OVER (PARTITION BY run_id ORDER BY committed_at, chain_seq) AS prev
  FROM runs_auditrecord WHERE run_id = ANY({ids}) AND committed_at >= {since}
) recent GROUP BY 1
""")

AUDIT_TALLY_KEY = "progress:audit-tally:v3:{}"


def _empty_tally() -> dict:
    return {"seq": 0, "hash": "", "tenants": {}, "moved": {}, "done": {}}


def audit_tallies(ids: list[int], recent: datetime, *, known: dict) -> tuple[dict[int, dict], dict]:
    """Per run in ``ids``, its audit trail summed: ``tenants`` (tenant → [rows, records,
    first commit, last commit]), ``moved`` (tenant → rows moved to it from the audit rows'
    own tenant by ``tenant_rows``, a chunk across tenants) and ``recent_rows`` (deleted since
    ``recent``).

    The trail is append-only and ``chain_seq`` is assigned under a lock held to commit, so a
    run's records up to the highest ``chain_seq`` seen never change: each run's sums up to
    there are kept in the shared cache with that record's hash, and a reading sums only the
    run's newer records (a range of index ``audit_run``) — a page of a run with a million
    audit rows reads the few committed since its last refresh, not the million. If the
    remembered record is gone or different (a restored or rebuilt database), the run's sums
    are computed again from its first record. ``recent_rows`` is read afresh every time (a
    range of index ``audit_run_time``): what is recent moves with the clock.

    ``known`` is what the cache held (the caller reads every entry of a page at once); the
    second value returned is the entries to write back (key → sums) for the runs that have
    new records."""
    out: dict[int, dict] = {}
    if not ids:
        return out, {}
    keys = {AUDIT_TALLY_KEY.format(run_id): run_id for run_id in ids}
    for key, run_id in keys.items():
        tally = known.get(key)
        out[run_id] = tally if isinstance(tally, dict) and "seq" in tally else _empty_tally()
    remembered = {t["seq"]: run_id for run_id, t in out.items() if t["seq"]}
    if remembered:
        still = set(
            AuditRecord.objects.filter(chain_seq__in=list(remembered)).values_list(
                "chain_seq", "hash", "run_id"
            )
        )
        for seq, run_id in remembered.items():
            if (seq, out[run_id]["hash"], run_id) not in still:
                out[run_id] = _empty_tally()
    changed: set[int] = set()
    with connection.cursor() as cur:
        # each run's last record (index audit_run, read backwards): only the runs with records
        # past the remembered one are read further
        cur.execute(_LAST_SEQ, [list(out)])
        behind = [
            (run_id, out[run_id]["seq"])
            for run_id, last in cur.fetchall()
            if last is not None and last > out[run_id]["seq"]
        ]
        rows = []
        if behind:
            branches = sql.SQL(" UNION ALL ").join(
                _NEWER_BRANCH.format(run=sql.Literal(run_id), seq=sql.Literal(seq))
                for run_id, seq in behind
            )
            cur.execute(_NEWER.format(branches=branches, busy=_BUSY).as_string(cur.connection))
            rows = cur.fetchall()
        for kind, run_id, name, summed, n, first, last, top, top_hash in rows:
            tally = out[run_id]
            if kind == "sum":
                was = tally["tenants"].setdefault(name, [0, 0, None, None])
                was[0] += _int(summed)
                was[1] += _int(n)
                was[2] = min(filter(None, (was[2], first)), default=None)
                was[3] = max(filter(None, (was[3], last)), default=None)
            elif kind == "moved":
                tally["moved"][name] = tally["moved"].get(name, 0) + _int(summed)
            elif kind == "busy":
                tally["admitted_s"] = tally.get("admitted_s", 0.0) + float(summed or 0)
            elif kind == "done":
                was = tally.setdefault("done", {}).setdefault(name, [0, 0, 0])
                was[0] += _int(n)
                was[1] += _int(summed)
                was[2] += _int(top)
            else:
                tally["seq"], tally["hash"] = top, top_hash
                changed.add(run_id)
        cur.execute(
            _RECENT.format(
                busy=_BUSY, ids=sql.Literal(list(out)), since=sql.Literal(recent)
            ).as_string(cur.connection)
        )
        recent_rows = {run_id: (_int(rows), float(busy or 0)) for run_id, rows, busy in cur}
    remember = {AUDIT_TALLY_KEY.format(run_id): dict(out[run_id]) for run_id in changed}
    for run_id, tally in out.items():
        tally["recent_rows"], tally["recent_admitted_s"] = recent_rows.get(run_id, (0, 0.0))
    return out, remember


TOP_TENANTS = 10  # with more than TOP_TENANTS + 2 tenants, the rest share one line


@dataclass
class TenantRow:
    """One line of a run's per-tenant table: what was deleted and what a hold defers, and
    the tenant's chunks only when chunks are a tenant's (``chunks`` is None otherwise)."""

    tenant: str
    rows_deleted: int = 0
    deferred: int = 0
    chunks: TenantProgress | None = None
    tenants: int = 1  # the "others" line stands for this many tenants


@dataclass
class TenantTable:
    rows: list[TenantRow]
    others: TenantRow | None  # the tenants past the top ones, summed (None: all are shown)
    per_tenant_chunks: bool
    untenanted: int = 0  # deleted rows without a tenant (null_tenant = "delete")


def tenant_table(
    p: RunProgress,
    *,
    per_tenant_chunks: bool,
    held: dict[str, int] | None = None,
    top: int = TOP_TENANTS,
) -> TenantTable:
    """A run's per-tenant lines, right for every chunk geometry. Deleted rows come from the
    audit trail (a chunk across tenants records its rows per tenant, ``tenant_rows``);
    ``held`` is the rows each tenant's holds defer (tenant as text, counted by the caller);
    the chunks of ``p.tenants`` are a tenant's only when ``per_tenant_chunks`` (otherwise
    they are the run's, tenant ""). At most ``top`` tenants are listed — the most deleted
    and deferred — and the rest summed in ``others``, when there are more than ``top`` + 2
    (an "others" line for one or two tenants would save nothing)."""
    held = held or {}
    lines: dict[str, TenantRow] = {}
    untenanted = 0
    for t in p.tenants:
        if t.tenant == "" and not per_tenant_chunks:
            untenanted += t.rows_deleted  # what no tenant column value names
            continue
        line = lines.setdefault(t.tenant, TenantRow(t.tenant))
        line.rows_deleted += t.rows_deleted
        if per_tenant_chunks:
            line.chunks = t
    for tenant, rows in held.items():
        lines.setdefault(tenant, TenantRow(tenant)).deferred += rows
    ranked = sorted(
        lines.values(), key=lambda r: (-(r.rows_deleted + r.deferred), natural_key(r.tenant))
    )
    shown, rest = (ranked[:top], ranked[top:]) if len(ranked) > top + 2 else (ranked, [])
    others = None
    if rest:
        others = TenantRow(
            "",
            rows_deleted=sum(r.rows_deleted for r in rest),
            deferred=sum(r.deferred for r in rest),
            tenants=len(rest),
        )
    shown.sort(key=lambda r: natural_key(r.tenant))
    return TenantTable(shown, others, per_tenant_chunks, untenanted)


def stopped_by(run: Run | None, policy, switch) -> tuple[str, str] | None:
    """What operator decision stops ``run`` (of ``policy``; ``run`` None: the policy's next
    run) from deleting, as (verdict, sentence), or None. ``switch`` is the global
    ``KillSwitch`` row (or None). The one diagnosis every surface shows: ``retention
    status``, the run page's health, the drain-window line and the overview card."""
    if run is not None and run.state == Run.State.PAUSED:
        return "paused", f"run {run.run_key} is paused: no chunk is admitted until it is resumed"
    if policy.paused:
        return "paused", (
            f"policy {policy.slug} is paused: no chunk is admitted until it is resumed"
        )
    if switch is not None and switch.on:
        return "stopped", (
            f"the global kill switch is on (turned on by {switch.changed_by}: "
            f"“{switch.reason}”): no chunk is admitted until it is turned off"
        )
    if run is not None and run.state == Run.State.CONFIRM:
        return "stopped", (
            f"run {run.run_key} is held for confirmation: nothing is deleted until on-call "
            "confirms it"
        )
    if run is not None and run.state == Run.State.ATTENTION:
        return "stopped", (
            f"run {run.run_key} needs attention: nothing is deleted until its dead letters are "
            "replayed or discarded or it is resumed"
        )
    return None


WHOLE_RUN_MIN_S = 10.0  # the whole run's pace counts once its commits span this long
ETA_SPREAD = 1.25  # the range is never narrower than this factor: no false precision


def _rates(p: RunProgress) -> list[float]:
    """The paces an ETA may assume (rows/s): the last ten minutes', and the whole run's once
    it was admitted ``WHOLE_RUN_MIN_S`` with three commits — both per second the run was
    admitted (``ADMITTED_GAP``), so a run paused, stopped or throttled to zero for a while is
    not judged slow for it. Rows per second change as a run moves through its table (a key
    range where fewer rows are old deletes fewer per chunk; the guard slows it for a while),
    so neither alone is right."""
    rates = [p.rate_per_s]
    if p.audit_records >= 3 and p.admitted_s >= WHOLE_RUN_MIN_S and p.rows_deleted:
        rates.append(p.rows_deleted / p.admitted_s)
    return rates


def eta_range(to_go: float, rates: list[float]) -> tuple[float, float]:
    """(soonest, latest) for ``to_go`` rows at the fastest and the slowest of ``rates``,
    widened about their geometric middle to at least ``ETA_SPREAD``."""
    soonest, latest = to_go / max(rates), to_go / min(rates)
    if latest < soonest * ETA_SPREAD:
        middle, half = math.sqrt(soonest * latest), math.sqrt(ETA_SPREAD)
        soonest, latest = middle / half, middle * half
    return soonest, latest


def _derive(p: RunProgress, admitted: int | None, started: datetime | None, now: datetime) -> None:
    """Expected rows, percent, rate and ETA from the counted figures."""
    planning = not p.planner_done and p.state not in Run.TERMINAL
    # what the run can delete at most once every row is in a chunk: the planned keys are
    # upper bounds, so their sum never makes the total (only caps it)
    most = p.rows_deleted + p.rows_outstanding
    if admitted is not None:
        p.rows_expected = max(admitted, p.rows_deleted)
        stale = admitted < p.rows_deleted  # more was deleted than was counted at admission
        p.expected_bound = AT_LEAST if (p.admission_capped or stale) else ABOUT
        if not planning and p.rows_expected > most:
            p.rows_expected, p.expected_bound = most, UP_TO
    elif planning:
        p.rows_expected, p.expected_bound = 0, ABOUT  # no count yet and the walk goes on
    else:
        p.rows_expected, p.expected_bound = most, UP_TO
    if p.state in (Run.State.DRAINED, Run.State.COUNTED):  # a count run: counted whole
        p.rows_expected = p.rows_deleted
        p.expected_bound = ABOUT
        p.percent = 100
    elif p.state in Run.OPEN:  # 100% means drained
        p.percent = min(99, _percent(p.rows_deleted, p.rows_expected))
    else:
        p.percent = _percent(p.rows_deleted, p.rows_expected)
    # The run's own pace over the last ten minutes, per second it was admitted (ADMITTED_GAP:
    # the time it was paused, stopped by the kill switch or throttled to zero counts for
    # nothing), at least a second.
    recent_rows = p.rate_per_s or 0.0
    p.rate_per_s = None
    if recent_rows and p.last_commit is not None:
        p.rate_per_s = recent_rows / max(1.0, p.recent_admitted_s)
    to_go = p.rows_expected - p.rows_deleted - (p.rows_outstanding - p.rows_pending)
    if p.state == Run.State.ACTIVE and p.rate_per_s and to_go > 0:
        p.eta_range_s = eta_range(to_go, _rates(p))
        p.eta_s = math.sqrt(p.eta_range_s[0] * p.eta_range_s[1])
    elif p.state == Run.State.ACTIVE and to_go <= 0 and p.planner_done and not p.chunks["pending"]:
        p.eta_s = 0.0
