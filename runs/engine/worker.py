"""The chunk worker: one short transaction per chunk, in few round trips.

    claim (committed on its own) → BEGIN → SET LOCAL timeouts, the fences (shared)
    → admission (kill switch, run state, approved version), ceilings' slots, chunk row lock
    → DELETE [archiving: returning its rows into a Parquet object, written and verified
      (archive.step)] (scope + eligibility, holds and keep rules inside), chain lock, chain head
    → audit row (hash-chained), chunk done, COMMIT

Nothing is acknowledged before COMMIT; a crash anywhere before it leaves the
chunk pending and its rows in place. A committed chunk is never claimed again,
so a redelivery is a no-op and there is exactly one audit row per chunk.

Statements whose results the worker does not need in between go to the server together, in one
round trip (``core.pipeline``); the server still runs them one after the other, so every
ordering below holds as if each were sent alone. A chunk that commits costs five round trips:
the claim, the transaction's BEGIN, the fences and admission, the DELETE and chain head, the
audit row and COMMIT (docs/engine.md, "Transactions").
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from psycopg import sql

from archive import step as archive_step
from archive import tables as archive_tables
from core import locks, timeouts
from core.pipeline import one_round_trip
from retention import cascades, decisions, introspect
from retention import predicate as P
from retention.models import PolicyVersion
from retention.spec import SpecError
from runs import actions
from runs.engine import breaker, guard, partitions, planner, reconciler, stopping
from runs.engine.errors import (
    PERMANENT,
    READ_ONLY,
    backoff,
    classify,
    connection_lost,
    dead_letter,
    sqlstate_of,
)
from runs.evidence import audit
from runs.fleet import mirror
from runs.models import (
    Chunk,
    Lease,
    Run,
    discarded_scope_rows,
    scopes_of,
)
from targets import connections as fleet_connections

log = logging.getLogger(__name__)

HOST = socket.gethostname()

# outcome kinds
DONE = "done"  # a chunk committed
NO_WORK = "no_work"  # nothing admissible right now
THROTTLED = "throttled"  # the guard refused; the chunk got not_before and a reason
BUSY = "busy"  # a concurrency ceiling is full
FAILED = "failed"  # the chunk failed; recorded for retry, split or dead letter
STOP = "stop"  # the run cannot go on here (paused, cancelled, superseded, kill switch)


@dataclass
class Outcome:
    kind: str
    chunk_id: int | None = None
    rows: int = 0
    seconds: float = 0.0
    reason: str = ""
    pending: int | None = None  # the run's pending chunks when it was claimed, if counted
    pause_s: float = 0.0  # the guard's duty cycle: this worker waits so long before its next chunk
    planned: int | None = None  # the claimed chunk's planned keys: the size ``seconds`` measured


@dataclass
class Claim:
    chunk_id: int
    tenant: str
    key_from: int | None  # a plain integer key's bounds as bigints (else None)
    key_to: int | None
    lo: tuple | None  # the bounds in any key type (``predicate.Bound``); hi None: to the end
    hi: tuple | None
    attempts: int  # attempts recorded so far, the killed one included
    killed: bool  # the previous attempt claimed the chunk and never recorded an outcome
    claimed_at: datetime | None = None  # this claim's time: the chunk is still ours while set
    pending: int | None = None  # the run's pending chunks at the claim (this one included)
    planned: int | None = None  # the keys in its range when planned (``Chunk.planned_rows``)

    @classmethod
    def from_row(cls, row) -> Claim:
        (chunk_id, tenant, key_from, key_to, lo, hi, attempts, killed, claimed_at, planned,
         pending) = row  # fmt: skip
        chunk = Chunk(key_from=key_from, key_to=key_to, lo=_json(lo), hi=_json(hi))
        lo, hi = chunk.bounds()
        return cls(
            chunk_id, tenant, key_from, key_to, lo, hi, attempts, killed, claimed_at, pending,
            planned,
        )  # fmt: skip


def _json(value):
    """A jsonb value read by a raw cursor (Django leaves it as text for the field to parse)."""
    return json.loads(value) if isinstance(value, str) else value


def _claim_ttl_s(spec) -> float:
    """How long a claim keeps other workers off its chunk before its own transaction has locked
    the chunk row: longer than that transaction's first lock wait (the fences)."""
    return min(spec.lock_timeout_ms, spec.statement_timeout_ms) / 1000 + 5


# a chunk of run %s a claim may take now: pending, not backing off, and not in another
# attempt's hands (its claim older than %s seconds: that attempt was killed)
_CLAIMABLE = sql.SQL(
    "run_id = %s AND state = 'pending' AND not_before <= clock_timestamp()"
    " AND (claimed_at IS NULL OR claimed_at < clock_timestamp() - make_interval(secs => %s))"
)


def _claimable(run: Run, spec) -> bool:
    """Whether a claim of ``run`` would find a chunk now (``_claim``'s condition)."""
    with connection.cursor() as cur:
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM runs_chunk WHERE {})").format(_CLAIMABLE)
        cur.execute(query.as_string(cur.connection), [run.id, _claim_ttl_s(spec)])
        return cur.fetchone()[0]


def _claim(
    run: Run,
    spec,
    *,
    chunk_id: int | None,
    skip_tenants: list[str],
    count_pending: bool = False,
    descending: bool = False,
) -> Claim | None:
    """Claim the next admissible chunk of the run (round-robin over tenants by ``seq``) in a
    committed step of its own, before the chunk transaction: the claim time stays on the chunk
    until an outcome is recorded. Finding it still there means the attempt that claimed it was
    killed (django-q2's task timeout, a crash) — that attempt is counted now.

    One statement in autocommit, its own transaction (asynchronous commit: a lost claim is
    harmless); ``count_pending``: it also counts the run's pending chunks (for the planner's
    window, ``drain``)."""
    query = sql.SQL(
        # set_config in a CTE the UPDATE joins: evaluated in the statement's transaction
        "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)),"
        " c AS (SELECT id, claimed_at FROM runs_chunk WHERE {}"
    ).format(_CLAIMABLE)
    params: list = [run.id, _claim_ttl_s(spec)]
    if chunk_id is not None:
        query += sql.SQL(" AND id = %s")
        params.append(chunk_id)
    if skip_tenants:
        query += sql.SQL(" AND tenant <> ALL(%s)")
        params.append(skip_tenants)
    query += sql.SQL(
        " ORDER BY seq DESC, id DESC LIMIT 1 FOR UPDATE SKIP LOCKED)"
        if descending
        else " ORDER BY seq, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
    )
    query += sql.SQL(
        " UPDATE runs_chunk k SET claimed_at = clock_timestamp(),"
        " attempts = k.attempts + (c.claimed_at IS NOT NULL)::int"
        " FROM c, s WHERE k.id = c.id"
        " RETURNING k.id, k.tenant, k.key_from, k.key_to, k.lo, k.hi, k.attempts,"
        " c.claimed_at IS NOT NULL, k.claimed_at, k.planned_rows, "
    )
    if count_pending:
        query += sql.SQL(
            "(SELECT count(*) FROM runs_chunk p WHERE p.run_id = %s AND p.state = 'pending')"
        )
        params.append(run.id)
    else:
        query += sql.SQL("NULL::bigint")
    with connection.cursor() as cur:
        cur.execute(query.as_string(cur.connection), params)
        row = cur.fetchone()
    return Claim.from_row(row) if row else None


def newest_first(spec) -> list[cascades.Edge]:
    """The table's foreign keys to itself that block a referenced row's deletion
    (``cascades.self_blocking_keys``, read once per ``predicate.cached_types`` scope): a run
    on such a table plans all its chunks before it claims one and claims them newest first, so
    that a row referencing an older one (a recorder's ``old_state_id``, a reply) goes before
    it; each chunk spares the rows a row that stays references."""
    return P.scoped(
        ("self_blocking", spec.schema, spec.table), lambda: cascades.self_blocking_keys(spec)
    )


def _release(chunk_id: int) -> None:
    """The attempt ends without an outcome of its own (refused, busy, throttled)."""
    Chunk.objects.pending().filter(pk=chunk_id).update(claimed_at=None)


def _slot_keys(scope: str, ceiling: int) -> list[int]:
    """The advisory keys of the ``ceiling`` slots of ``scope``, tried in this order
    (``runs_try_slot``: the first free one is taken, until the transaction ends)."""
    return [locks.int4(f"{scope}:{n}") for n in range(ceiling)]


@dataclass
class Admission:
    """What the chunk transaction's admission statement found and took."""

    refusal: str  # why the run may not start a chunk; '' when it may
    approved: bool  # the run's version is still the approved one
    busy: str  # which ceiling is full ('' when every slot was taken)
    locked: bool  # the chunk row is locked (else finished, cancelled or taken over meanwhile)
    outside: list = field(default_factory=list)  # the run's discarded scopes


_ADMISSION = sql.SQL(
    "SELECT a.kill, a.state, a.enabled, a.paused, a.version_state, a.discarded,"
    " g.slot, p.slot, c.locked, t.slot"
    " FROM (SELECT"
    " coalesce((SELECT k.on FROM retention_killswitch k WHERE k.name = 'global'), false) AS kill,"
    " (SELECT r.state FROM runs_run r WHERE r.id = %s) AS state,"
    " (SELECT p.enabled FROM retention_policy p WHERE p.id = %s) AS enabled,"
    " (SELECT p.paused FROM retention_policy p WHERE p.id = %s) AS paused,"
    " (SELECT v.state FROM retention_policyversion v WHERE v.id = %s) AS version_state,"
    " (SELECT coalesce(json_agg(json_build_array(d.tenant, d.key_from, d.key_to, d.lo, d.hi)),"
    " '[]') FROM ({discarded}) AS d (tenant, key_from, key_to, lo, hi)) AS discarded"
    " OFFSET 0) a"  # read once: not pulled up into each step's condition
    # the slots and the chunk lock, in this order, each only if the step before succeeded
    " CROSS JOIN LATERAL (SELECT CASE WHEN NOT a.kill AND a.state = %s AND a.enabled"
    " AND NOT a.paused AND a.version_state = %s"
    " THEN runs_try_slot(%s::int, %s::int[]) END AS slot) g"
    " CROSS JOIN LATERAL (SELECT CASE WHEN g.slot IS NOT NULL"
    " THEN runs_try_slot(%s::int, %s::int[]) END AS slot) p"
    # the chunk row, still pending and still claimed by this attempt (a lock held meanwhile by
    # another claim statement passing over it is waited for; a chunk another attempt took over
    # is not ours any more)
    " CROSS JOIN LATERAL (SELECT CASE WHEN p.slot IS NOT NULL THEN EXISTS (SELECT FROM runs_chunk k"
    " WHERE k.id = %s AND k.state = 'pending' AND k.claimed_at = %s FOR UPDATE) END AS locked) c"
    " CROSS JOIN LATERAL (SELECT CASE WHEN c.locked AND %s"
    " THEN runs_try_slot(%s::int, %s::int[]) END AS slot) t"
)


# per (target, run): the admission statement and its discarded scopes' parameters (run ids are
# each ledger's own)
_ADMISSIONS: dict = {}


def _admission_statement(run: Run) -> tuple[str, tuple]:
    """The admission statement of ``run``'s chunks, composed once per run (compiling the
    discarded scopes' queryset costs more than the statement's round trip)."""
    key = (fleet_connections.current(), run.pk)
    found = _ADMISSIONS.get(key)
    if found is None:
        if len(_ADMISSIONS) >= 64:
            _ADMISSIONS.clear()
        # the discarded scopes' subquery is the ORM's SQL of a queryset (its values bound)
        discarded, params = discarded_scope_rows(run).query.sql_with_params()
        connection.ensure_connection()
        text = _ADMISSION.format(discarded=sql.SQL(discarded)).as_string(connection.connection)
        found = _ADMISSIONS[key] = (text, params)
    return found


def _open_chunk_transaction(
    run: Run, spec, claim: Claim, *, per_tenant: bool, policy_slots: int
) -> Admission:
    """The first two statements of a chunk transaction, in one round trip.

    First: set its timeouts and commit mode and take the global fence (legal holds, the kill
    switch) and the policy's fence (approval, pause, cancel) shared. Then, in a statement of
    its own — the server starts it after the first finished, so its snapshot is taken after
    the fences were granted and it sees every decision that committed before — read what
    admission depends on (kill switch, run and policy state, approved version, the run's
    discarded scopes) and, only if the run may go on, take in order: a global ceiling slot, a
    policy slot, the chunk row (``FOR UPDATE``, only while still pending and claimed by this
    attempt), a tenant slot (per-tenant chunks).
    Each step runs only if the one before succeeded. A decision takes its fence exclusive, so
    it either committed before this chunk's fences (and is seen here) or waits until this
    chunk has committed."""
    cfg = settings.RETENTION
    sync = "on" if cfg["SYNCHRONOUS_COMMIT"] else "off"
    admission, discarded_params = _admission_statement(run)
    params = [
        run.pk,
        run.policy_id,
        run.policy_id,
        run.policy_version_id,
        *discarded_params,
        Run.State.ACTIVE.value,
        PolicyVersion.State.APPROVED.value,
        locks.CEILING_GLOBAL,
        _slot_keys("global", cfg["GLOBAL_CEILING"]),
        locks.CEILING_POLICY,
        # the controller's setting, never over the run's own ceiling (one for a slice run)
        _slot_keys(f"policy:{run.policy_id}", min(policy_slots, policy_ceiling(run, spec))),
        claim.chunk_id,
        claim.claimed_at,
        per_tenant,
        locks.CEILING_TENANT,
        # a chunk across tenants has no tenant of its own: the policy ceiling bounds it
        _slot_keys(f"{run.policy_id}:{claim.tenant}", spec.tenant_workers) if per_tenant else [],
    ]
    with connection.cursor() as fences, connection.cursor() as cur:
        with one_round_trip():
            fences.execute(
                "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true),"
                " set_config('synchronous_commit', %s, true), pg_advisory_xact_lock_shared(%s, 0),"
                " pg_advisory_xact_lock_shared(%s, %s)",
                [
                    f"{spec.lock_timeout_ms}ms",
                    f"{spec.statement_timeout_ms}ms",
                    sync,
                    locks.HOLDS,
                    locks.POLICY_FENCE,
                    run.policy_id,
                ],
            )
            cur.execute(admission, params)
        row = cur.fetchone()
    kill, state, enabled, paused, version_state, outside, g, p, locked, t = row
    approved = version_state == PolicyVersion.State.APPROVED
    refusal = ""
    if kill:
        refusal = "global kill switch is on"
    elif state != Run.State.ACTIVE:
        refusal = f"run is {state}"
    elif not enabled:
        refusal = "policy is disabled"
    elif paused:
        refusal = "policy is paused"
    busy = ""
    if g is None:
        busy = "global ceiling reached"
    elif p is None:
        busy = "policy ceiling reached"
    elif locked and per_tenant and t is None:
        busy = TENANT_BUSY
    return Admission(refusal, approved, busy, bool(locked), scopes_of(run, _json(outside)))


TENANT_BUSY = "tenant_busy"  # internal: try a chunk of another tenant


def policy_ceiling(run: Run, spec) -> int:
    """Chunk transactions of the policy at once while ``run`` drains: the policy's workers, one
    for a slice run (the lowest concurrency: one chunk at a time)."""
    return 1 if run.rollout == "slice" else spec.policy_workers


def process_one(run: Run, *, chunk_id: int | None = None) -> Outcome:
    """Run one chunk transaction for ``run`` (or the given chunk). Never raises for a chunk error.
    The target's column types are read from the catalog once per run and version and kept
    until a chunk fails (``P.cached_types``, ``P.forget_types``)."""
    with P.cached_types(types_token(run)), mirror.gate(run.policy_id) as gated:
        if not gated:  # on a target: a decision holds the control database's fences
            return Outcome(BUSY, reason="waiting for an operator decision to commit")
        return _process_one(run, chunk_id=chunk_id)


def types_token(run: Run) -> tuple:
    return ("run", run.pk, run.policy_version_id)


def _process_one(run: Run, *, chunk_id: int | None) -> Outcome:
    spec = run.policy_version.parsed
    verdict = guard.admission(run, spec)  # from the shared sample, before the transaction opens
    skip: list[str] = []
    count_pending = not run.planner_done  # the planner tops up the window by this count
    for _ in range(4):
        claim = _claim(
            run, spec, chunk_id=chunk_id, skip_tenants=skip, count_pending=count_pending,
            descending=bool(newest_first(spec)),
        )  # fmt: skip
        if claim is None:
            return Outcome(
                NO_WORK if not skip else BUSY, reason="tenant ceilings reached" if skip else ""
            )
        try:
            outcome = _attempt(run, spec, claim, verdict)
        except DatabaseError as exc:
            if sqlstate_of(exc) != "55P03":
                raise  # the claim stays: the attempt failed without a record and counts
            # queued behind a decision that waits for the chunks in flight: retry shortly
            _release(claim.chunk_id)
            return Outcome(BUSY, reason="waiting for an operator decision to commit")
        outcome.pending, outcome.planned = claim.pending, claim.planned
        if outcome.kind == DONE:
            outcome.pause_s = guard.pause_after(
                spec, verdict, outcome.seconds, slots=policy_ceiling(run, spec)
            )
        if outcome.kind != TENANT_BUSY:
            return outcome
        skip.append(claim.tenant)
    return Outcome(BUSY, reason="tenant ceilings reached")


class _DeleteFailed(Exception):
    def __init__(self, error: BaseException, *, archive: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.archive = archive  # the archive object failed, not the DELETE


class _CommitFailed(_DeleteFailed):
    """The audit row, the chunk's state or COMMIT failed: the transaction is gone."""


def _attempt(run: Run, spec, claim: Claim, verdict) -> Outcome:
    """The chunk transaction of one claimed chunk. A failure while committing it (after its
    DELETE: the audit row, the chunk's state, COMMIT itself) rolls everything back; it is then
    recorded like a failed DELETE — retried, split or dead-lettered by its SQLSTATE — in a
    transaction of its own that locks the chunk again, rather than left for the drain loop to
    take for a lost connection. A lost connection still goes there."""
    try:
        return _chunk_transaction(run, spec, claim, verdict)
    except _CommitFailed as failed:
        exc = failed.error
        with transaction.atomic():
            mine = Chunk.objects.select_for_update().filter(
                pk=claim.chunk_id, state=Chunk.State.PENDING, claimed_at=claim.claimed_at
            )
            if mine.exists():  # still this claim's: no other attempt took it over meanwhile
                _record_failure(run, claim.chunk_id, claim.attempts, exc)
        return Outcome(
            FAILED,
            claim.chunk_id,
            reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )


def _chunk_transaction(run: Run, spec, claim: Claim, verdict) -> Outcome:
    chunk_id, tenant, attempts = claim.chunk_id, claim.tenant, claim.attempts
    per_tenant = run.per_tenant(spec)
    # Our own transaction (not a savepoint in a caller's): COMMIT goes with the last statements.
    own = not connection.in_atomic_block
    with transaction.atomic():
        admitted = _open_chunk_transaction(
            run,
            spec,
            claim,
            per_tenant=per_tenant,
            # the guard's controller may run fewer of the policy's chunks at once
            policy_slots=verdict.concurrency or spec.policy_workers,
        )
        if admitted.refusal:
            _release(chunk_id)
            return Outcome(STOP, reason=admitted.refusal)
        if not admitted.approved:
            _release(chunk_id)
            actions.supersede_run(run)
            return Outcome(STOP, reason="policy version superseded")
        unsigned = decisions.approval_refusal(run.policy_version)
        if unsigned:  # approved by a row no signature vouches for: delete nothing
            _release(chunk_id)
            return Outcome(STOP, reason=unsigned)
        if admitted.busy and admitted.busy != TENANT_BUSY:
            _release(chunk_id)
            return Outcome(BUSY, reason=admitted.busy)
        if not admitted.locked:  # finished, cancelled or taken over by another attempt meanwhile
            return Outcome(NO_WORK)
        if admitted.busy == TENANT_BUSY:
            _release(chunk_id)
            return Outcome(TENANT_BUSY)
        if claim.killed and _record_killed(run, chunk_id, attempts):
            return Outcome(FAILED, chunk_id, reason="the previous attempt was killed")

        if not verdict.admit:
            Chunk.objects.filter(pk=chunk_id).update(
                not_before=timezone.now() + timedelta(seconds=backoff(1, base=1.0, cap=5.0)),
                throttle_reason=verdict.reason,
                claimed_at=None,
            )
            return Outcome(THROTTLED, chunk_id, reason=verdict.reason)

        started = timezone.now()
        t0 = time.monotonic()
        # read after the fences: a version approved since is respected by this chunk
        try:
            graph, cascade = cascades.for_run(
                spec, policy_id=run.policy_id, cutoff=run.bound, tick=run.tick
            )
        except SpecError as exc:  # the table's cascades changed into ones no guard can follow
            _record_failure(run, chunk_id, attempts, exc)
            return Outcome(FAILED, chunk_id, reason=str(exc))
        rows = dict(
            policy_id=run.policy_id,
            cutoff=run.bound,
            tenant=tenant if per_tenant else None,
            key_from=claim.lo,
            key_to=claim.hi,
            outside=admitted.outside,
            columns=run.bound_columns(spec),
        )
        by_tenant = bool(spec.tenant) and not per_tenant
        if run.counts_only:
            return _count_chunk(run, spec, claim, rows, cascade, t0, commit=own)
        spare = None
        selfs = newest_first(spec)
        if selfs:  # rows a row that stays references are spared, not failed on

            def chunk(alias: str) -> P.Fragment:
                with P.aliased(alias):
                    return P.chunk_rows(spec, **rows)

            spare = cascades.spare_referenced(spec, selfs, chunk)
        referenced = P.scoped(
            ("deferred_refs", spec.schema, spec.table), lambda: cascades.deferred_references(spec)
        )
        if referenced:  # rows other tables' deferred keys reference stay, not failed on
            kept = cascades.kept_referenced(referenced)
            spare = kept if spare is None else P.Fragment.join([kept, spare], " AND ")
        archived = None
        condition = cascade
        if spare is not None:
            condition = spare if cascade is None else P.Fragment.join([cascade, spare], " AND ")
        left = P.Fragment.join(
            [P.chunk_rows(spec, **rows), *([condition] if condition is not None else [])],
            " AND ",
        )
        # a row-level BEFORE DELETE trigger may keep rows the DELETE matched (RETURN NULL):
        # those still matching after it are counted, kept, in the chunk's audit record
        triggered = P.scoped(
            ("before_delete", spec.schema, spec.table),
            lambda: introspect.has_before_delete_trigger(spec.schema, spec.table),
        )
        kept = (
            P.Fragment(
                sql.SQL("SELECT count(*) FROM {} WHERE {}").format(P.table(spec), left.sql),
                left.params,
            )
            if triggered
            else None
        )
        try:
            if spec.archive_to:  # the DELETE returns its rows, archived before the commit
                archived = _archive_delete(
                    spec, run_id=run.id, chunk_id=chunk_id, attempt=attempts + 1, rows=rows,
                    by_tenant=by_tenant, cascade=cascade, spare=spare, kept=kept,
                )  # fmt: skip
                deleted, tenant_rows, head, table_rows, kept_by_triggers = archived.result
            else:
                statement = P.delete_chunk(spec, **rows, by_tenant=by_tenant, cascade=condition)
                deleted, tenant_rows, head, table_rows, kept_by_triggers = _delete(
                    statement,
                    kept=kept,
                    by_tenant=by_tenant,
                    counted=graph if cascade is not None else None,
                    lock=P.lock_chunk(spec, **rows) if cascade is not None else None,
                    reach=cascades.lock_reach(graph, P.chunk_rows(spec, **rows))
                    if cascade is not None
                    else (),
                )
        except _DeleteFailed as failed:
            # If the connection itself is gone, recording fails too and the error reaches
            # drain(): the whole transaction is lost, the chunk stays pending and claimed, and
            # the next claim counts this attempt.
            exc = failed.error
            _record_failure(run, chunk_id, attempts, exc)
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if failed.archive:
                reason = f"archive: {reason}"
            return Outcome(FAILED, chunk_id, reason=reason)

        record = audit.link(
            {
                "chunk_id": chunk_id,
                "run_id": run.id,
                "policy_version_id": run.policy_version_id,
                "policy_slug": spec.slug,
                "table_name": spec.qualified_table,
                "cutoff": run.bound,  # a slice run's bound: what its DELETE compared with
                "tenant": tenant,
                **_audit_bounds(claim, run.own_bound_columns()),
                "attempt": attempts + 1,
                "worker_host": HOST,
                "worker_pid": os.getpid(),
                "rows_deleted": deleted,
                "tenant_rows": tenant_rows,
                "table_rows": table_rows,
                "started_at": started,
                "outcome": "deleted",
                "run_key": run.run_key,
                "archive": archived.chunk.record() if archived is not None else None,
                "rows_kept_by_triggers": kept_by_triggers,
                **audit.version_facts(run.policy_version),
            },
            head,
        )
        try:
            _finish(record, chunk_id, attempts + 1, commit=own)
        except DatabaseError as exc:
            if not own or connection_lost(exc):
                raise
            raise _CommitFailed(exc) from exc
        seconds = time.monotonic() - t0
    return Outcome(DONE, chunk_id, rows=deleted, seconds=seconds)


def _count_chunk(
    run: Run, spec, claim: Claim, rows: dict, cascade, t0: float, *, commit: bool
) -> Outcome:
    """A count run's chunk: instead of its DELETE, one short statement over the same scope and
    the same eligibility predicate (``predicate.count_chunk``) counts what the DELETE would
    remove — per tenant and month — and the rows keep rules keep and legal holds defer; the
    chunk is done with the counts on it, nothing deleted and no audit record (nothing to
    prove removed). A failure is recorded like a failed DELETE's (retried, split or
    dead-lettered)."""
    statement = P.count_chunk(spec, **rows, cascade=cascade)
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement.sql.as_string(cur.connection), statement.params)
            found = cur.fetchall()
    except DatabaseError as exc:
        if connection_lost(exc):
            raise
        _record_failure(run, claim.chunk_id, claim.attempts, exc)
        return Outcome(FAILED, claim.chunk_id, reason=str(exc).splitlines()[0] if str(exc) else "")
    counts = P.chunk_counts(found)
    with connection.cursor() as cur, one_round_trip():
        cur.execute(
            "UPDATE runs_chunk SET state = %s, done_at = %s, attempts = %s, throttle_reason = '',"
            " claimed_at = NULL, counts = %s WHERE id = %s",
            [
                Chunk.State.DONE.value,
                timezone.now(),
                claim.attempts + 1,
                json.dumps(counts),
                claim.chunk_id,
            ],
        )
        if commit:
            cur.execute("COMMIT")
    return Outcome(DONE, claim.chunk_id, rows=0, seconds=time.monotonic() - t0)


def _delete(
    statement: P.Fragment,
    *,
    kept: P.Fragment | None = None,
    by_tenant: bool,
    counted: cascades.Graph | None = None,
    lock: P.Fragment | None = None,
    reach: Sequence[cascades.Lock] = (),
) -> tuple[int, dict | None, tuple, dict | None, int | None]:
    """The chunk's DELETE in a savepoint, then the chain lock and the chain head, in one round
    trip: (rows deleted, rows per tenant of a chunk across tenants, the head for
    ``audit.link``, rows removed per table of ``counted``: the tables its cascades reach,
    from PostgreSQL's per-transaction statistics read just before and just after the DELETE,
    the rows ``kept`` counts right after the DELETE — the rows it matched that are still
    there, kept by a BEFORE DELETE trigger — or None without ``kept``;
    ``lock``: ``predicate.lock_chunk``, sent first where cascades are judged; ``reach``:
    ``cascades.lock_reach``, the rows those cascades reach, locked next, so that the DELETE
    judges each on its committed value and nothing changes it before the cascade removes it).
    The chain lock comes after the DELETE, so the DELETEs of two workers
    overlap and only their audit rows queue; it is held until commit, so records chain in
    commit order. A DELETE that fails raises ``_DeleteFailed`` with the transaction back at
    the savepoint, still holding the chunk's lock, so the failure is recorded in it; a failure
    after the DELETE (the chain lock's timeout, a lost connection) loses the transaction."""
    stats = cascades.deleted_rows(counted) if counted is not None else None
    with (
        connection.cursor() as cur,
        connection.cursor() as delete,
        connection.cursor() as head,
        connection.cursor() as before,
        connection.cursor() as after,
        connection.cursor() as left,
    ):

        def begin() -> None:
            cur.execute("SAVEPOINT chunk_delete")
            # a deferred foreign key (Django creates every one DEFERRABLE INITIALLY DEFERRED)
            # would fail only at COMMIT, after the audit row; checked at the end of the DELETE
            # instead, its violation is the statement's own failure, with its SQLSTATE, and the
            # chunk is bisected to the referenced rows like any other
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
            if lock is not None:
                cur.execute(lock.sql.as_string(cur.connection), lock.params)

        def rest() -> None:
            if stats is not None:
                before.execute(stats.sql.as_string(before.connection), stats.params)
            delete.execute(statement.sql.as_string(delete.connection), statement.params)
            if stats is not None:
                after.execute(stats.sql.as_string(after.connection), stats.params)
            if kept is not None:
                left.execute(kept.sql.as_string(left.connection), kept.params)
            cur.execute("RELEASE SAVEPOINT chunk_delete")
            audit.lock_and_read_head(head)

        try:
            if reach:  # the rows the cascades reach are locked between, a round trip each
                with one_round_trip():
                    begin()
                _lock_reach(cur, reach)
                with one_round_trip():
                    rest()
            else:
                with one_round_trip():
                    begin()
                    rest()
        except DatabaseError as exc:
            if delete.pgresult is not None:  # the DELETE ran: what failed came after it
                raise
            cur.execute("ROLLBACK TO SAVEPOINT chunk_delete")
            raise _DeleteFailed(exc) from exc
        table_rows = None
        kept_rows = int(left.fetchone()[0]) if kept is not None else None
        if stats is not None:
            was = dict(before.fetchall())
            table_rows = {
                counted.names[oid]: int(n) - int(was.get(oid) or 0) for oid, n in after.fetchall()
            }
        if by_tenant:  # rows deleted per tenant; rows without a tenant (null_tenant =
            # "delete") are the rest of the total: a record's tenant_rows name tenants only
            counts = [(t, int(n)) for t, n in delete.fetchall()]
            tenant_rows = {t: n for t, n in counts if t is not None}
            return sum(n for _t, n in counts), tenant_rows, head.fetchone(), table_rows, kept_rows
        return delete.rowcount, None, head.fetchone(), table_rows, kept_rows


@dataclass
class _Archived:
    chunk: archive_step.ArchivedChunk
    result: tuple  # as ``_delete`` returns


def _archive_delete(
    spec,
    *,
    run_id: int,
    chunk_id: int,
    attempt: int,
    rows: dict,
    by_tenant: bool,
    cascade,
    spare,
    kept: P.Fragment | None = None,
) -> _Archived:
    """An archiving chunk's DELETE (``archive.step``): in a savepoint, the DELETE returns its
    rows into the chunk attempt's Parquet object, written and read back; then the chain lock
    and head as ``_delete`` takes them. A failure of the DELETE or of the object (the
    destination read-only or full, a value Parquet cannot hold) rolls back to the savepoint,
    nothing deleted, and raises ``_DeleteFailed``. ``kept``: as ``_delete``'s."""
    with connection.cursor() as cur, connection.cursor() as head, connection.cursor() as left:
        with one_round_trip():
            cur.execute("SAVEPOINT chunk_delete")
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as ``_delete``
        try:
            with connection.wrap_database_errors:
                if spec.archive_table is not None:  # a table in a registered database
                    chunk = archive_tables.archive_chunk(
                        cur.cursor, spec, run_id=run_id, chunk_id=chunk_id, rows=rows,
                        by_tenant=by_tenant, cascade=cascade, spare=spare,
                    )  # fmt: skip
                else:
                    chunk = archive_step.archive_chunk(
                        cur.cursor, spec, run_id=run_id, chunk_id=chunk_id, attempt=attempt,
                        rows=rows, by_tenant=by_tenant, cascade=cascade, spare=spare,
                    )  # fmt: skip
        except (DatabaseError, archive_step.ArchiveFailed) as exc:
            cur.execute("ROLLBACK TO SAVEPOINT chunk_delete")
            if isinstance(exc, archive_step.ArchiveFailed):
                raise _DeleteFailed(exc.error, archive=True) from exc
            raise _DeleteFailed(exc) from exc
        with one_round_trip():
            if kept is not None:
                left.execute(kept.sql.as_string(left.connection), kept.params)
            cur.execute("RELEASE SAVEPOINT chunk_delete")
            audit.lock_and_read_head(head)
        tenant_rows = None
        if by_tenant:
            tenant_rows = {t: n for t, n in chunk.tenant_rows.items() if t is not None}
        kept_rows = int(left.fetchone()[0]) if kept is not None else None
        return _Archived(chunk, (chunk.deleted, tenant_rows, head.fetchone(), None, kept_rows))


def _lock_reach(cur, reach: Sequence[cascades.Lock]) -> None:
    """The statements of ``cascades.lock_reach``, in order, one round trip each; one that walks a
    table referencing itself runs again until it locks no row it had not (a row referencing
    one it walked, committed while it walked), before the tables below it are locked."""
    for step in reach:
        text = step.statement.sql.as_string(cur.connection)
        found = None
        for _ in range(MAX_REACH_ROUNDS if step.again else 1):
            cur.execute(text, step.statement.params)
            locked = cur.fetchone()[0]
            if locked == found:
                break
            found = locked


MAX_REACH_ROUNDS = 16  # rounds of a walk in ``_lock_reach`` at most


def _finish(record: dict, chunk_id: int, attempts: int, *, commit: bool) -> None:
    """The audit row, the chunk done and (in the worker's own transaction) COMMIT, in one round
    trip. COMMIT is sent here rather than by ``transaction.atomic`` on exit, which then finds
    the transaction committed and has nothing left to send."""
    insert, params = audit.insert(record)
    with connection.cursor() as cur, one_round_trip():
        cur.execute(insert, params)
        cur.execute(
            "UPDATE runs_chunk SET state = %s, done_at = %s, attempts = %s, throttle_reason = '',"
            " claimed_at = NULL WHERE id = %s",
            [Chunk.State.DONE.value, timezone.now(), attempts, chunk_id],
        )
        if commit:
            cur.execute("COMMIT")


def _record_killed(run: Run, chunk_id: int, attempts: int) -> bool:
    """The previous attempt (already counted in ``attempts``) was killed before it recorded
    anything — most likely it outlived django-q2's task timeout. Like a statement timeout: split
    the chunk if it can be split, dead-letter it when its attempts are spent; otherwise this
    attempt goes on at the same size. True when the chunk was split or dead-lettered."""
    message = (
        f"attempt {attempts} was killed before it recorded an outcome "
        f"(django-q2's task timeout or a crashed worker)"
    )
    chunk = Chunk.objects.get(pk=chunk_id)
    cfg = settings.RETENTION
    if _split(chunk, cfg["SPLIT_FLOOR_ROWS"]):
        Chunk.objects.filter(pk=chunk_id).update(
            state=Chunk.State.SPLIT, last_error=message, last_sqlstate="", claimed_at=None
        )
        return True
    if attempts >= cfg["MAX_ATTEMPTS"]:
        Chunk.objects.filter(pk=chunk_id).update(
            state=Chunk.State.DEAD, last_error=message, last_sqlstate="", claimed_at=None
        )
        dead_letter(chunk=chunk, run=run, error_class="exhausted", sqlstate="",
                    message=f"attempts exhausted: {message}", attempts=attempts)  # fmt: skip
        return True
    Chunk.objects.filter(pk=chunk_id).update(last_error=message, last_sqlstate="")
    return False


def _record_failure(run: Run, chunk_id: int, attempts: int, exc: BaseException) -> None:
    """Retry later, split, or dead-letter — inside the chunk's transaction, still holding its lock."""
    cls = classify(exc)
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:2000]
    attempts += 1
    log.warning(
        "run %s: chunk %s failed (attempt %s, %s%s): %s", run.run_key, chunk_id, attempts,
        cls.label, f", SQLSTATE {cls.sqlstate}" if cls.sqlstate else "", message,
    )  # fmt: skip
    P.forget_types(types_token(run))  # the table may have changed: read its types afresh
    chunk = Chunk.objects.get(pk=chunk_id)
    cfg = settings.RETENTION
    # a transient error that a smaller chunk may avoid splits it down to the floor; a row-level
    # permanent error (a restricting foreign key, a constraint) bisects it down to the offending
    # rows, so everything else in the chunk is deleted
    transient_split = cls.kind != PERMANENT and cls.split
    row_level = cls.kind == PERMANENT and cls.sqlstate.startswith("23")
    if (transient_split and _split(chunk, cfg["SPLIT_FLOOR_ROWS"])) or (
        row_level and _split(chunk, 0)
    ):
        Chunk.objects.filter(pk=chunk_id).update(
            state=Chunk.State.SPLIT,
            attempts=attempts,
            last_error=message,
            last_sqlstate=cls.sqlstate,
            claimed_at=None,
        )
        return
    cause = breaker.cause_of(exc, cls)
    in_a_row = breaker.trips(run, cls, cause)
    if in_a_row:
        # one cause, one problem: the run stops and this chunk stays pending (runs.engine.breaker)
        Chunk.objects.filter(pk=chunk_id).update(
            attempts=attempts,
            last_error=message,
            last_sqlstate=cls.sqlstate,
            not_before=timezone.now(),
            claimed_at=None,
        )
        why = breaker.reason(cause, cls.label, message, in_a_row)
        actions.run_needs_attention(run, actor="worker", reason=why)
        log.error("run %s needs attention: %s", run.run_key, why)
        return
    if cls.kind == PERMANENT or attempts >= cfg["MAX_ATTEMPTS"]:
        Chunk.objects.filter(pk=chunk_id).update(
            state=Chunk.State.DEAD,
            attempts=attempts,
            last_error=message,
            last_sqlstate=cls.sqlstate,
            claimed_at=None,
        )
        dead_letter(
            chunk=chunk,
            run=run,
            error_class=cls.kind if cls.kind == PERMANENT else "exhausted",
            sqlstate=cls.sqlstate,
            message=f"{cls.label}: {message}",
            attempts=attempts,
            extra={"cause": cause},
        )
        return
    Chunk.objects.filter(pk=chunk_id).update(
        attempts=attempts,
        last_error=message,
        last_sqlstate=cls.sqlstate,
        not_before=timezone.now() + timedelta(seconds=backoff(attempts)),
        claimed_at=None,
    )


def _audit_bounds(claim: Claim, columns: list[str] | None = None) -> dict:
    """The bounds an audit record carries: a plain integer key's as bigints (chain version 2),
    any other key's as texts per column (version 4); bounds on other columns than the key
    (timestamp chunks) as texts with those columns named (version 6)."""
    if claim.key_from is not None and columns is None:
        return {"key_from": claim.key_from, "key_to": claim.key_to}
    out = {
        "key_from": None,
        "key_to": None,
        "key_lo": list(claim.lo),
        "key_hi": None if claim.hi is None else list(claim.hi),
    }
    if columns is not None:
        out["bound_columns"] = list(columns)
    return out


def _split(chunk: Chunk, floor_rows: int) -> bool:
    """Replace a chunk that timed out by its two halves (same run, pass, tenant and order): a
    plain integer key's interval is bisected arithmetically; any other key's (and any chunk
    on other columns than the key: timestamp chunks) at its median bound (one index-only
    ordered read of the chunk columns, in a savepoint: if even that fails, the chunk is not
    split). ``planned_rows`` counts keys (what a chunk can delete at most): the floor
    compares keys, and the halves share their parent's count."""
    if chunk.planned_rows < 2 * floor_rows:
        return False
    lo, hi = chunk.bounds()
    if chunk.key_from is not None:
        end = chunk.key_to if chunk.key_to is not None else planner.LEDGER_KEY_MAX + 1
        if end - chunk.key_from < 2:
            return False
        mid = chunk.key_from + (end - chunk.key_from) // 2
        halves = [
            (chunk.key_from, mid, (str(chunk.key_from),), (str(mid),)),
            (mid, chunk.key_to, (str(mid),), hi),
        ]
    else:
        middle = _median_key(chunk, lo, hi)
        if middle is None or middle == lo:
            return False
        halves = [(None, None, lo, middle), (None, None, middle, hi)]
    first_half = chunk.planned_rows // 2
    for (key_from, key_to, half_lo, half_hi), planned in zip(
        halves, (first_half, chunk.planned_rows - first_half), strict=True
    ):
        identity = {"hi": list(half_hi)} if half_hi is not None else {"hi__isnull": True}
        Chunk.objects.get_or_create(
            run_id=chunk.run_id,
            pass_no=chunk.pass_no,
            tenant=chunk.tenant,
            key_from=key_from,
            key_to=key_to,
            lo=list(half_lo),
            **identity,
            defaults={
                "seq": chunk.seq,
                "planned_rows": planned,
                "parent": chunk,
                "hi": None if half_hi is None else list(half_hi),
            },
        )
    return True


def _median_key(chunk: Chunk, lo: tuple, hi: tuple | None) -> tuple | None:
    """The bound (on the run's chunk columns) half way through the chunk's keys, or None:
    ``OFFSET planned_rows / 2`` over the chunk's range of the chunk columns' index (tenant and
    chunk columns only, an Index Only Scan; the halves' DELETEs apply the eligibility
    predicate)."""
    run = chunk.run
    spec = run.policy_version.parsed
    tenant = chunk.tenant if run.per_tenant(spec) else None
    columns = run.bound_columns(spec)
    where = P.in_scope(spec, tenant=tenant, key_from=lo, key_to=hi, columns=columns)
    query = P.Fragment(
        sql.SQL("SELECT {k} FROM {t} WHERE {w} ORDER BY {o} OFFSET %s LIMIT 1").format(
            k=P.key_texts(spec, columns=columns),
            t=P.table(spec),
            w=where.sql,
            o=P.key_order(spec, columns=columns),
        ),  # fmt: skip
        [*where.params, max(1, chunk.planned_rows // 2)],
    )
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(query.sql.as_string(cur.connection), query.params)
            row = cur.fetchone()
    except DatabaseError:
        return None
    return tuple(row) if row else None


def _planning_failed(run: Run, exc: BaseException) -> str:
    """A permanent error while planning (a column renamed, a value the ledger cannot hold, …):
    the run needs attention, with a dead letter that says what failed and where planning stood.
    Replaying the dead letter (after fixing the cause) or resuming the run plans again."""
    cls = classify(exc)
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:2000]
    reason = f"planning failed: {cls.label}: {message}"
    with transaction.atomic():
        moved = actions.run_needs_attention(run, actor="worker", reason=reason)
        if moved:  # one dead letter, however many leases hit the same error
            dead_letter(
                chunk=None,
                run=run,
                error_class=PERMANENT,
                sqlstate=cls.sqlstate,
                message=reason,
                attempts=1,
                extra={
                    "stage": "planning",
                    "pass": run.pass_no,
                    **getattr(exc, "planning_context", {}),
                },
            )
    log.error("run %s needs attention: %s", run.run_key, reason)
    return reason


def _hidden_rows(run: Run) -> list[str]:
    """One line per table of the run (its target, the tables its cascades reach) whose
    row-level security hides rows from this login (``introspect.hidden_tables``): such a run
    would delete what it may see and verify that nothing is left."""
    if run.state != Run.State.ACTIVE:
        return []
    try:
        with P.cached_types(types_token(run)):
            graph, _cascade = cascades.for_run(
                run.policy_version.parsed, policy_id=run.policy_id, cutoff=run.bound, tick=run.tick
            )
    except SpecError:
        return []  # the chunks dead-letter it, naming the foreign key
    return introspect.hidden_tables(graph)


def _refuse_hidden(run: Run, hidden: list[str]) -> str:
    """The run needs attention before it deletes anything: one line naming the table (and one
    dead letter, however many leases find it)."""
    reason = f"refused: {hidden[0]}"
    with transaction.atomic():
        if actions.run_needs_attention(run, actor="worker", reason=reason):
            dead_letter(
                chunk=None, run=run, error_class=PERMANENT, sqlstate="42501",
                message=reason, attempts=1, extra={"stage": "row-level security"},
            )  # fmt: skip
    log.error("run %s: %s", run.run_key, reason)
    return reason


def _pace(run: Run, outcome: Outcome, deadline: float) -> None:
    """Honour the policy's optional rate cap (rows/s across its workers) and the guard's duty
    cycle (``outcome.pause_s``), whichever waits longer."""
    spec = run.policy_version.parsed
    wait = outcome.pause_s
    if spec.pace_rows_per_s:
        per_worker = spec.pace_rows_per_s / policy_ceiling(run, spec)
        wait = max(wait, outcome.rows / per_worker - outcome.seconds)
    if wait > 0:
        mirror.pause(wait)  # a decision waits for this pause only within the gate's window
        guard.sample_beside(wait + guard.SAMPLER_LINGER_S)  # its sampler goes on meanwhile
        stopping.sleep(min(wait, max(0.0, deadline - time.monotonic())))


WHOLE_PASS = 10**9  # the planning window of a run planned whole before its first claim
# a worker with nothing to claim while another worker's planner holds the cursors waits for
# that window this long at most (``planner.wait_for_window``: it wakes when the window commits)
PLANNING_WAIT_S = 2.0
IDLE_NOTE_EVERY_S = 5.0  # a reason unchanged is written again at most this often


def note_idle(run: Run, reason: str) -> None:
    """Record on the run why a lease admits nothing right now, when no chunk carries the
    reason (the partition step held back by the guard, planning postponed by a lock,
    ceilings full): a run with no admitted chunk always says why (``runs.status``). One
    statement, committed asynchronously, that never waits for the run's row."""
    with connection.cursor() as cur:
        cur.execute(
            "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)),"
            " r AS (SELECT id FROM runs_run WHERE id = %s FOR NO KEY UPDATE SKIP LOCKED)"
            " UPDATE runs_run SET idle_reason = %s, idle_since = clock_timestamp()"
            " FROM s, r WHERE runs_run.id = r.id",
            [run.pk, reason[:2000]],
        )


class IdleNotes:
    """A lease's ``note_idle``: a new reason at once, the same one at most every
    ``IDLE_NOTE_EVERY_S`` (so its time stays newer than the run's last commit)."""

    def __init__(self, run: Run) -> None:
        self.run, self.last, self.at = run, "", 0.0

    def note(self, reason: str) -> None:
        if reason == self.last and time.monotonic() - self.at < IDLE_NOTE_EVERY_S:
            return
        note_idle(self.run, reason)
        self.last, self.at = reason, time.monotonic()


def planning_window(run: Run, window: int, *, measured: bool) -> int:
    """How many pending chunks the planner keeps ahead of this lease: ``PLANNER_WINDOW``, fewer
    as chunks grow past 4× the policy's size, so that what is planned ahead at a size the guard
    may yet halve stays at most a window of chunks of 4× the policy's size — and a quarter of
    that until the size is ``measured`` (``SizeSettling``): a run's first chunks, and those
    after each jump of the size, are planned a few at a time, so that the chunks after them are
    planned at the size they steered to, not the whole of a short run at a size it outgrew.
    At the policy's own size (a run's first chunks), two until measured: one for each of two
    workers, measured before more are planned at that size, which is usually far under the
    target (on a 1M-row table, eight first chunks of 5,000 keys took 134 ms of the run's
    680 ms, for 40,000 of its 450,000 keys)."""
    policy_size = run.policy_version.parsed.chunk_size
    if not measured and (run.chunk_size or policy_size) == policy_size:
        return min(window, 2)
    ahead = min(window, max(4, window * 4 * policy_size // (run.chunk_size or policy_size)))
    return ahead if measured else max(2, ahead // 4)


def size_bounds(spec) -> tuple[int, int]:
    """The floor and ceiling of a run's chunk size: the policy's / 16 (at least 10), × 16."""
    return max(10, spec.chunk_size // 16), spec.chunk_size * 16


class SizeSettling:
    """Whether a lease has measured the run's current chunk size (``planning_window``): a chunk
    planned at that size that did not make it jump (double or more) settles it; a jump
    unsettles it; a chunk planned at another size (before a jump, a split, a tenant's last
    rows) leaves it as it was. At the ceiling it is settled: it cannot grow."""

    def __init__(self) -> None:
        self.measured = False

    def step(self, run: Run, outcome: Outcome) -> None:
        spec = run.policy_version.parsed
        before = run.chunk_size or spec.chunk_size
        adapt_chunk_size(run, outcome.seconds, outcome.planned)
        after = run.chunk_size or spec.chunk_size
        if after >= 2 * before:
            self.measured = False
        elif outcome.planned == before or after >= size_bounds(spec)[1]:
            self.measured = True


def adapt_chunk_size(run: Run, seconds: float | None, planned: int | None = None) -> int:
    """Steer the size of chunks planned next toward the policy's target transaction time, from
    a chunk of ``planned`` keys (default: the current size) that took ``seconds``: while under
    half of it, grow toward half the target in one step, in proportion (half the target ÷ the
    chunk's time: 8× at most, a run's first chunks, sized by the policy before anything was
    measured; +10% at least); a chunk's time is its fixed costs plus its rows', so the next
    one stays under the target. Halve when over it or under guard pressure (``seconds`` None),
    within [chunk_size/16, chunk_size×16] of the policy. Proportional, not a jump under an
    eighth and +10% above it: a run's first chunks, slowed by a cold backend or a planner
    beside them, took a little over an eighth and grew the size by a tenth where they could
    have grown it 3×, and the run's next window was planned at that size.

    The size is the run's, shared by every worker draining it. Each step moves the stored size
    in one statement, so one worker's step composes with another's instead of overwriting it
    with a copy it read earlier, and it steps from the smaller of the stored size and the
    measured chunk's: a chunk planned before the size grew (a run's first ones, finished by a
    second worker) never shrinks it by growing less, and one planned before the guard halved
    it never grows it past the halved size by more than a step."""
    spec = run.policy_version.parsed
    current = run.chunk_size or spec.chunk_size
    floor, ceiling = size_bounds(spec)
    target = guard.target_chunk_ms(run.policy_id, spec) / 1000  # the controller's setting
    if seconds is None or seconds > 1.5 * target:
        grow, factor = False, 0.5
        planned = None if seconds is None else planned  # pressure: halve what is stored
    elif seconds < 0.5 * target:
        grow = True
        factor = max(1.1, min(8.0, target / 2 / max(seconds, 1e-6)))
        if current >= ceiling:
            return current
    else:
        return current
    base = min(current, planned) if planned else current
    if grow:
        local = max(current, min(ceiling, max(base + 1, round(base * factor))))
    else:
        local = max(floor, base // 2)
    with connection.cursor() as cur:
        # one statement, committed asynchronously (its WAL flush would cost more than the
        # chunk's round trips): a size lost in a crash only steers the next chunks less.
        # It never waits for the run's row: while another session holds it (a finisher
        # verifying the run, an operator's decision) this worker's copy steps alone
        cur.execute(
            "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)),"
            " r AS (SELECT id, coalesce(chunk_size, %s) AS c FROM runs_run WHERE id = %s"
            " FOR NO KEY UPDATE SKIP LOCKED)"
            " UPDATE runs_run SET chunk_size = CASE WHEN %s"
            " THEN GREATEST(r.c, LEAST(%s, GREATEST(b.b + 1, round(b.b * %s)::int)))"
            " ELSE GREATEST(%s, b.b / 2) END"
            " FROM s, r, LATERAL (SELECT LEAST(r.c, %s) AS b) b WHERE runs_run.id = r.id"
            " RETURNING runs_run.chunk_size",
            [
                spec.chunk_size, run.pk,
                grow, ceiling, factor, floor,
                planned,
            ],
        )  # fmt: skip
        row = cur.fetchone()
    run.chunk_size = row[0] if row else local
    return run.chunk_size


def read_above_beside(run: Run) -> threading.Thread | None:
    """Start the verification's read above the pass's last key (``reconciler.read_above``) in
    a thread of this process with its own connection, once the pass's bounds are known: it
    then overlaps the pass's chunks — this lease's and any other worker's — instead of
    following them at the finish. None: the run's verification does not read it early, or
    another session has taken it."""
    if not reconciler.reads_above_early(run, run.policy_version.parsed):
        return None
    if not reconciler.above_unread(run):
        return None
    thread = threading.Thread(
        # on the target in place: the thread's own connection goes to the same database
        target=fleet_connections.carry(_read_above),
        args=(run.pk,),
        name=f"read-above-{run.pk}",
        daemon=True,
    )
    thread.start()
    return thread


def _read_above(run_id: int) -> None:
    try:
        with timeouts.engine_session():
            run = Run.objects.select_related("policy_version").filter(pk=run_id).first()
            if run is not None and run.state == Run.State.ACTIVE:
                reconciler.read_above(run)
    except Exception:  # noqa: BLE001 - the finish then reads what lies above the last chunk
        log.warning("the early read above run %s's last key failed", run_id, exc_info=True)
    finally:
        connection.close()  # this thread's own connection


def drain(
    run_id: int,
    *,
    slot: int | None = None,
    generation: int | None = None,
    budget_s: float | None = None,
    until_idle: bool = False,
) -> dict:
    """Drain chunks of one run until the budget ends, the run stops or no work is left.
    Returns counters; ``continue`` says work remains. When nothing is admissible right now
    (chunks backing off, throttled by the guard, ceilings full) a lease waits within its
    budget; with ``until_idle`` it returns at once (``stopped`` = "idle: <why>") and the caller
    decides when to come back. With a lease (slot, generation) it stops when superseded.
    On a target, consecutive chunks share one gate window on the control database
    (``mirror.lease``); the window ends before anything else the lease waits on or plans."""
    with mirror.lease():
        return _drain(
            run_id, slot=slot, generation=generation, budget_s=budget_s, until_idle=until_idle
        )


def _drain(
    run_id: int,
    *,
    slot: int | None,
    generation: int | None,
    budget_s: float | None,
    until_idle: bool,
) -> dict:
    budget = budget_s if budget_s is not None else settings.RETENTION["LEASE_BUDGET_S"]
    deadline = time.monotonic() + budget
    stats = {
        "chunks": 0, "rows": 0, "failed": 0, "throttled": 0, "stopped": "", "continue": False,
        "planned": 0, "planner_waits": 0,  # chunks this lease planned; waits for another's window
    }  # fmt: skip
    last_beat = 0.0
    window = settings.RETENTION["PLANNER_WINDOW"]

    def load() -> Run | None:
        return Run.objects.select_related("policy_version", "policy").filter(pk=run_id).first()

    planning_failures = 0
    # another worker's planner held the cursors at this lease's last planner call: its window is
    # on the way, so this lease drains what is pending meanwhile instead of asking again on
    # every chunk, and waits for that window when nothing is left to claim
    planner_busy = False
    # the run's pending chunks as its last claim counted them (None: unknown, count them): the
    # planner tops the window up when half of it is left
    pending: int | None = None
    settled = (
        False  # the run's partitions (runs.engine.partitions) are settled: no need to ask again
    )
    run = load()
    if run is None:
        stats["stopped"] = "run not found"
        return stats
    hidden = _hidden_rows(run)
    if hidden:
        stats["stopped"] = _refuse_hidden(run, hidden)
        return stats
    idle = IdleNotes(run)
    sizing = SizeSettling()
    if settings.RETENTION.get("GUARD", True):
        # before this lease plans or reads anything: the guard's sample, whose idle probes
        # learn the table's baseline when it has none (a run's first lease) — taken while
        # none of the run's work is in flight, where the sampler thread's first sample would
        # meet the planner's first window and the read above the last key, and learn a
        # baseline several times the foreground's own (a worker that finds another's sample
        # being taken waits for it: ``guard.sample``)
        guard.sample(by="lease")
    reclaims = 0  # claims in a row that found nothing while a chunk could be claimed
    early: threading.Thread | None = None  # this lease's read above the pass's last key
    looked_above = False  # whether this lease has looked whether that read is to be taken
    while time.monotonic() < deadline:
        if stopping.requested():  # the worker is stopping: end at this chunk boundary
            stats["stopped"] = "worker stopping"
            stats["continue"] = True  # the next generation waits in the queue for a live worker
            return stats
        guard.sample_beside()  # the guard's samples, taken beside the chunks, not between them
        try:
            if slot is not None and time.monotonic() - last_beat > 2:
                # the heartbeat doubles as the generation check: a superseded lease updates nothing
                if not Lease.objects.filter(run_id=run_id, slot=slot, generation=generation).update(
                    heartbeat_at=timezone.now()
                ):
                    stats["stopped"] = "lease superseded"
                    return stats
                last_beat = time.monotonic()
            if not settled:
                mirror.release()
                outcome = (
                    partitions.settle(run, deadline=deadline)
                    if partitions.needs_settling(run)
                    else partitions.SETTLED
                )
                if outcome.startswith(partitions.REFUSED):  # as a refused chunk: STOP
                    stats["stopped"] = outcome.removeprefix(partitions.REFUSED)
                    return stats
                settled = outcome == partitions.SETTLED
                if outcome.startswith(f"{partitions.POSTPONED}: "):
                    why = outcome.split(": ", 1)[1]
                    idle.note(
                        f"{why} (the partition step waits)"
                        if why.startswith("throttled: ")
                        else f"partitions postponed: {why}"
                    )
            if not settled:
                # the guard, a decision in progress or another lease: the planner waits, so
                # that no partition it could take whole is planned as chunks meanwhile
                run = load()
                if run is None or run.state != Run.State.ACTIVE:
                    stats["stopped"] = f"run is {run.state if run else 'gone'}"
                    return stats
                if until_idle:
                    stats["stopped"] = "idle: partitions postponed"
                    stats["continue"] = True
                    return stats
                stopping.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            with P.cached_types(types_token(run)):
                whole = bool(newest_first(run.policy_version.parsed))
            if whole and not run.planner_done and planner_busy:
                # newest first: no chunk is claimed before the last one is planned
                mirror.release()
                planner.wait_for_window(
                    run, min(PLANNING_WAIT_S, max(0.001, deadline - time.monotonic()))
                )
                planner_busy = False
                run = load()
                if run is None or run.state != Run.State.ACTIVE:
                    stats["stopped"] = f"run is {run.state if run else 'gone'}"
                    return stats
                continue
            if not run.planner_done and not planner_busy:
                if pending is None:
                    pending = Chunk.objects.pending().filter(run=run).count()
                ahead = planning_window(run, window, measured=sizing.measured)
                if whole:  # every chunk of the pass, before the newest is claimed
                    ahead = WHOLE_PASS
                if pending <= ahead // 2:
                    pending = None  # the next claim counts them again
                    mirror.release()  # a decision does not wait for the planner
                    try:
                        planned = planner.plan(run, window=ahead, deadline=deadline)
                        planner_busy = planned.busy
                        stats["planned"] += planned
                        if not looked_above:  # the pass's bounds are known now
                            looked_above = True
                            early = read_above_beside(run)
                    except DatabaseError as exc:
                        if connection_lost(exc):
                            raise
                        planning_failures += 1
                        if classify(exc).kind == PERMANENT:
                            stats["stopped"] = _planning_failed(run, exc)
                            return stats
                        # transient (lock or statement timeout, serialization): back off
                        log.warning("planning run %s failed, retrying: %s", run.run_key, exc)
                        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                        idle.note(f"planning postponed: {classify(exc).label}: {first[:500]}")
                        stats["failed"] += 1
                        stopping.sleep(
                            min(
                                backoff(planning_failures, cap=10.0),
                                max(0.0, deadline - time.monotonic()),
                            )
                        )
                        continue
            if whole and not run.planner_done:
                continue  # the planner's next step (its deadline or another's cursors ended it)
            outcome = process_one(run)
        except DatabaseError as exc:
            if sqlstate_of(exc) == READ_ONLY or sqlstate_of(exc)[:2] == "42":
                # a database that accepts no writes (a replica after a fail-over), or an access
                # rule outside any chunk's own handling that no retry mends (a grant the login
                # lacks on the ledger or the mirror, a ledger table gone): nothing here can go
                # on until a person acts; the caller says so (a target: its runs' attention,
                # naming it and the error)
                raise
            # The connection failed (killed backend, server restart) between or inside chunk
            # transactions: whatever was not committed is still pending. Reconnect and go on.
            log.warning("lost the database connection: %s", exc)
            mirror.release()
            connection.close()
            stats["failed"] += 1
            stopping.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            continue
        if outcome.pending is not None:
            if planner_busy and pending is not None and outcome.pending > pending:
                planner_busy = False  # the other planner's window has committed
            pending = outcome.pending - (outcome.kind == DONE)  # the claimed chunk is done
        if outcome.kind != NO_WORK:
            reclaims = 0
        if outcome.kind != DONE:
            mirror.release()  # the window spans consecutive chunks only
        if outcome.kind == DONE:
            stats["chunks"] += 1
            stats["rows"] += outcome.rows
            sizing.step(run, outcome)
            _pace(run, outcome, deadline)
            continue
        if outcome.kind == FAILED:
            stats["failed"] += 1
            continue
        if outcome.kind == STOP:
            stats["stopped"] = outcome.reason
            return stats
        if outcome.kind == NO_WORK:
            run = load()
            if run is None or run.state != Run.State.ACTIVE:
                stats["stopped"] = f"run is {run.state if run else 'gone'}"
                return stats
            has_pending = Chunk.objects.pending().filter(run=run).exists()
            if run.planner_done and not has_pending:
                if early is not None:  # its record, not a read of the same range beside it
                    early.join(timeouts.engine_statement_ms() / 1000)
                reconciler.finish_run(run)
                stats["stopped"] = "no work left"
                return stats
            pending = None if has_pending else 0
            if has_pending and reclaims < 3 and _claimable(run, run.policy_version.parsed):
                # the claim found nothing a moment ago, and now there is a chunk to take:
                # another worker's window committed in between (a run's first window, planned
                # by the worker that started first) — claim again rather than leave the run
                # as idle, which ``--until-idle`` and the task's next generation wait out
                reclaims += 1
                continue
            if not run.planner_done and not has_pending:
                if planner_busy:
                    # another worker's planner holds the cursors: wait for its window to commit
                    # (a lock wait that ends with its transaction) rather than ask again in a
                    # loop, then count what is pending again — that window has filled it —
                    # and claim from it; plan at once only if it did not (rolled back)
                    stats["planner_waits"] += 1
                    planner.wait_for_window(
                        run, min(PLANNING_WAIT_S, max(0.001, deadline - time.monotonic()))
                    )
                    planner_busy = False
                    pending = None
                continue
        if outcome.kind == THROTTLED:
            stats["throttled"] += 1
            adapt_chunk_size(run, None)
        if outcome.kind == BUSY and outcome.reason:
            idle.note(outcome.reason)  # no chunk carries it: the run does
        if until_idle:  # nothing this worker can do right now: the caller decides when to retry
            stats["stopped"] = f"idle: {outcome.reason or 'no chunk is admissible now'}"
            stats["continue"] = True
            return stats
        stopping.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    stats["continue"] = True
    return stats
