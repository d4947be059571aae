"""State changes of runs, chunks and dead letters. Each is one transaction that writes
its operator-action record; each names who and why."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from core import timeouts
from core.locks import decision_fence
from core.oplog import ActionError, StaleDecision, check_decision, record_action, require_reason
from core.roles import ONCALL, check_role, check_role_or_system
from retention import cascades, decisions, floors, geometry
from retention import predicate as P
from retention.models import KillSwitch, Policy
from retention.schedule_math import period_label
from runs.counts import count_totals
from runs.engine import dispatch
from runs.engine.schedules import sync_policy_schedule
from runs.models import MAX_DISCARDED_SCOPES, Chunk, DeadLetter, PartitionAction, Run
from runs.progress import progress_for
from targets import connections as fleet_connections

BLAST_RADIUS_FLOOR = 10_000  # below this many rows a run never needs confirmation


def run_key_for(policy: Policy, tick: datetime, *, rerun_of_version: int | None = None) -> str:
    """One key per (policy, logical period): the tick as wall-clock time in the policy's zone;
    a re-run of the period under a newly approved version (its earlier run superseded)
    appends that version's number: ``events/2026-11-30T03:00/v2``."""
    key = f"{policy.slug}/{period_label(policy, tick)}"
    # on a target, the key names it (``runs.fleet.runs.key_on``); the control database's keys
    # are as they always were
    target = fleet_connections.current()
    if target != fleet_connections.DEFAULT:
        key = f"{target}:{key}"
    return key if rerun_of_version is None else f"{key}/v{rerun_of_version}"


def live_run_of_period(policy: Policy, tick: datetime) -> Run | None:
    """The period's run that is not superseded (at most one: ``run_one_live_per_period``)."""
    return Run.objects.filter(policy=policy, tick=tick).exclude(state=Run.State.SUPERSEDED).first()


def _actor_name(actor) -> str:
    return getattr(actor, "username", None) or str(actor)


def _check_oncall(actor) -> None:
    """Run controls are a person's: on-call (a name, even a system's, has no role)."""
    check_role(actor, ONCALL)


@transaction.atomic
def trigger_run(
    policy: Policy,
    *,
    tick: datetime,
    source: str = "schedule",
    actor="scheduler",
    skipped_ticks: list | tuple = (),
) -> tuple[Run, bool]:
    """Create the run for ``tick`` or return the existing one (duplicate triggers converge
    on the unique run_key). The cutoff is derived here, once, from the tick. A person
    (a manual trigger) needs the on-call role; the scheduler and start-up name themselves.

    A period whose run was superseded (a newer version was approved while it was open) is run
    again under the approved version: a new run, keyed ``<period>/v<number>``, that names the
    run it replaces. A period has at most one live run (invariant 1, in the database:
    ``run_one_live_per_period``); a drained, cancelled or skipped period is never re-run."""
    check_role_or_system(actor, ONCALL)
    version = policy.approved_version
    if version is None:
        raise ActionError(f"policy {policy.slug} has no approved version; nothing may run")
    refusal = decisions.approval_refusal(version)
    if refusal:  # an approval written behind the product's back runs nothing
        raise ActionError(f"policy {policy.slug}: {refusal}; nothing may run")
    if not policy.enabled:
        raise ActionError(f"policy {policy.slug} is disabled")
    spec = version.parsed
    key, replaces = run_key_for(policy, tick), None
    latest = Run.objects.filter(policy=policy, tick=tick).order_by("-id").first()
    if latest is not None:
        if latest.state != Run.State.SUPERSEDED or latest.policy_version_id == version.pk:
            return live_run_of_period(policy, tick) or latest, False
        replaces = latest
        key = run_key_for(policy, tick, rerun_of_version=version.number)
    shape = geometry.choose_safely(spec)  # what its chunks run along, fixed like the cutoff
    try:
        with transaction.atomic():
            run = Run.objects.create(
                chunking=shape.kind, chunking_reason=shape.reason,
                chunk_columns=list(shape.columns),
                run_key=key, policy=policy, policy_version=version, tick=tick,
                cutoff=spec.cutoff_for(tick), source=source, created_by=_actor_name(actor),
                rollout=spec.rollout, slice_bound=spec.slice_bound(spec.cutoff_for(tick)),
                skipped_ticks=list(skipped_ticks), chunk_size=spec.chunk_size, state=Run.State.WAITING,
                replaces=replaces,
            )  # fmt: skip
    except IntegrityError:  # a concurrent trigger created it first
        return live_run_of_period(policy, tick) or Run.objects.get(run_key=key), False
    extra = {"replaces": replaces.run_key} if replaces is not None else {}
    if run.rollout != "full":
        extra["rollout"] = run.rollout
    if run.slice_bound is not None:
        extra["slice_bound"] = run.slice_bound.isoformat()
    record_action(actor, "run.trigger", run, reason=f"{source} trigger for tick {tick.isoformat()}",
                  cutoff=run.cutoff.isoformat(), version=version.number, skipped=len(skipped_ticks),
                  **extra)  # fmt: skip
    _admit_new_run(run, spec)
    run.refresh_from_db()
    return run, True


def _eligible_count(run: Run, spec, limit: int) -> int | None:
    frag = P.count_where(
        spec, P.eligible(spec, policy_id=run.policy_id, cutoff=run.bound), limit=limit
    )
    try:
        with (
            transaction.atomic(),
            timeouts.bounded(20_000, timeouts.target_lock_ms(spec)),
            connection.cursor() as cur,
        ):
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            return cur.fetchone()[0]
    except Exception:  # a slow count must not stop the trigger; the run starts without an estimate
        return None


def _admit_new_run(run: Run, spec) -> None:
    """Decide what a new run does: skipped (policy paused, or ``overlap = "skip"`` behind an
    open run), folded with the policy's waiting run (at most one waits), or admitted."""
    policy = Policy.objects.select_for_update().get(pk=run.policy_id)  # one admission at a time
    if policy.paused:
        _skip(run, f"skipped: policy {policy.slug} is paused ({policy.paused_reason})")
        return
    earlier = (
        Run.objects.filter(policy=policy, state__in=Run.OPEN)
        .exclude(pk=run.pk)
        .order_by("tick")
        .first()
    )
    if earlier is not None and spec.overlap == "skip":
        _skip(run, f"skipped: run {earlier.run_key} was still {earlier.state}")
        return
    fold_waiting_runs(policy, actor=run.created_by)
    start_waiting_runs(policy, actor="scheduler", reason="admitted")


def _skip(run: Run, reason: str) -> None:
    _set_state(run, Run.State.SKIPPED, reason)
    run.finished_at = timezone.now()
    run.save(update_fields=["finished_at"])


def fold_waiting_runs(policy: Policy, *, actor) -> Run | None:
    """At most one run of a policy waits: the one with the newest tick. Older waiting runs are
    skipped ("folded into" it, on the operator log) and their ticks recorded on it — its
    cutoff is the newest, so it deletes everything they would have."""
    waiting = list(
        Run.objects.select_for_update()
        .filter(policy=policy, state=Run.State.WAITING)
        .order_by("-tick", "-id")
    )
    if not waiting:
        return None
    keeper, older = waiting[0], waiting[1:]
    if older:
        ticks = set(keeper.skipped_ticks)
        for run in older:
            ticks.add(run.tick.isoformat())
            ticks.update(run.skipped_ticks)
            reason = f"folded into {keeper.run_key}: at most one run of a policy waits"
            _skip(run, reason)
            record_action(actor, "run.fold", run, reason=reason, into=keeper.run_key)
        keeper.skipped_ticks = sorted(ticks)
        keeper.save(update_fields=["skipped_ticks"])
    return keeper


def admit(run: Run, *, actor, reason: str) -> Run:
    """Admission, whatever path starts a run (its trigger, the end of the run it waited for,
    a cancel): the blast-radius check, then start. A run whose eligible count could not be
    taken in time stays waiting (the reconciler tries again); it never starts unchecked."""
    spec = run.policy_version.parsed
    below = floors.violation(spec)
    if below is not None:
        # a floor approved after the version: the run stops before its first chunk, visibly
        why = f"stopped by a retention floor: {below}; approve a version that keeps as long"
        _set_state(run, Run.State.ATTENTION, why[:2000])
        record_action(actor, "run.attention", run, reason=why[:2000])
        return run
    if run.counts_only:
        # deletes nothing, so there is no blast radius to check; its own chunks are the count
        # (bounded statements admitted by the guard, not one count of the whole table here)
        return start_run(run, actor=actor, reason=reason)
    baseline, source = _blast_baseline(run)
    limit = (
        max(BLAST_RADIUS_FLOOR, int(baseline * spec.blast_radius)) + 1 if baseline else 50_000_000
    )
    eligible = _eligible_count(run, spec, limit)
    if baseline and eligible is None:
        _set_state(
            run, Run.State.WAITING,
            "admission postponed: the blast-radius count did not finish in time; tried again next pass",
        )  # fmt: skip
        return run
    run.expected_rows = eligible
    run.save(update_fields=["expected_rows"])
    if baseline and eligible is not None and eligible >= limit:
        _set_state(
            run, Run.State.CONFIRM,
            f"held for confirmation: more than {limit - 1:,} eligible rows, over {spec.blast_radius:g}× "
            f"the baseline of {baseline:,} ({source})",
        )  # fmt: skip
        run.held_at = timezone.now()
        run.save(update_fields=["held_at"])
        record_action(actor, "run.hold", run, reason=run.state_reason, eligible=eligible)
        return run
    return start_run(run, actor=actor, reason=reason)


def _blast_baseline(run: Run) -> tuple[int | None, str]:
    """What this run's size is compared with, and where that number comes from: the previous
    drained run of the same approved version; for a version's first run, the preview its
    approver saw (a new version is expected to differ from the old one's runs); without a
    preview, the policy's previous drained run."""
    version = run.policy_version
    drained = Run.objects.filter(policy=run.policy, state=Run.State.DRAINED).exclude(pk=run.pk)
    previous = drained.filter(policy_version=version).order_by("-tick").first()
    if previous is not None:
        return _rows_deleted(previous), f"previous run {previous.run_key}"
    value = (version.preview or {}).get("eligible")
    if isinstance(value, int):
        return value, f"v{version.number}'s approved preview"
    previous = drained.order_by("-tick").first()
    if previous is not None:
        return _rows_deleted(previous), f"previous run {previous.run_key}"
    return None, ""


def _rows_deleted(run: Run) -> int:
    # admission runs in the scheduler's worker too, whose login may not read the pages' cache
    return progress_for([run.pk], now=timezone.now(), remembered=False)[run.pk].rows_deleted


def _check_run_decision(run: Run, expected: str | None) -> None:
    """A control posted from a page rendered for an older state of the run is refused (the
    message does not repeat the run: the surface names it, "Resume run … refused: …")."""
    check_decision(run, expected, now_is=run.describe())


def _set_state(run: Run, state: str, reason: str) -> None:
    run.state = state
    run.state_reason = reason
    run.save(update_fields=["state", "state_reason"])


@transaction.atomic
def start_run(run: Run, *, actor, reason: str = "") -> Run:
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.state not in (Run.State.WAITING, Run.State.CONFIRM):
        raise ActionError(f"run {run.run_key} is {run.state}; only a waiting run can start")
    run.state = Run.State.ACTIVE
    run.state_reason = ""
    run.started_at = run.started_at or timezone.now()
    run.save(update_fields=["state", "state_reason", "started_at"])
    record_action(actor, "run.start", run, reason=reason)
    if not KillSwitch.is_on() and not run.policy.paused:
        dispatch.ensure_leases(run)
    return run


@transaction.atomic
def confirm_run(run: Run, *, actor, reason: str, expected: str | None = None) -> Run:
    """Let a run held by the blast-radius guard start."""
    _check_oncall(actor)
    reason = require_reason(reason, "confirming a run")
    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_run_decision(run, expected)
    if run.state != Run.State.CONFIRM:
        raise ActionError(f"run {run.run_key} is {run.state}, not held for confirmation")
    record_action(actor, "run.confirm", run, reason=reason)
    return start_run(run, actor=actor, reason=reason)


@transaction.atomic
def pause_run(run: Run, *, actor, reason: str, expected: str | None = None) -> Run:
    """Stop admitting new chunks of the run; a chunk transaction in flight finishes."""
    _check_oncall(actor)
    reason = require_reason(reason, "pausing a run")
    decision_fence(run.policy_id)  # chunks in flight commit first; none starts after the pause
    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_run_decision(run, expected)
    if run.state not in (Run.State.ACTIVE, Run.State.ATTENTION):
        raise ActionError(f"run {run.run_key} is {run.state}; only an active run can be paused")
    run.state, run.state_reason = Run.State.PAUSED, f"paused by {_actor_name(actor)}: {reason}"
    run.save(update_fields=["state", "state_reason"])
    record_action(actor, "run.pause", run, reason=reason)
    return run


@transaction.atomic
def resume_run(run: Run, *, actor, reason: str, expected: str | None = None) -> Run:
    """Resume the same run (same key, cutoff and chunks) where it stood."""
    _check_oncall(actor)
    reason = require_reason(reason, "resuming a run")
    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_run_decision(run, expected)
    if run.state not in (Run.State.PAUSED, Run.State.ATTENTION):
        raise ActionError(
            f"run {run.run_key} is {run.state}; only a paused run or one needing attention can resume"
        )
    floors.check_version(run.policy_version.parsed)  # a floor set since: it may not go on
    run.state, run.state_reason = Run.State.ACTIVE, ""
    run.save(update_fields=["state", "state_reason"])
    record_action(actor, "run.resume", run, reason=reason)
    dispatch.republish_all(run)
    return run


@transaction.atomic
def cancel_run(run: Run, *, actor, reason: str, expected: str | None = None) -> Run:
    """End the run for good: pending chunks are cancelled; what was deleted stays audited."""
    _check_oncall(actor)
    reason = require_reason(reason, "cancelling a run")
    decision_fence(run.policy_id)  # chunks in flight commit first; none starts after the cancel
    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_run_decision(run, expected)
    if run.is_terminal:
        raise ActionError(f"run {run.run_key} is already {run.state}")
    cancelled = Chunk.objects.pending().filter(run=run).update(state=Chunk.State.CANCELLED)
    run.state, run.state_reason = (
        Run.State.CANCELLED,
        f"cancelled by {_actor_name(actor)}: {reason}",
    )
    run.finished_at = timezone.now()
    run.save(update_fields=["state", "state_reason", "finished_at"])
    record_action(actor, "run.cancel", run, reason=reason, chunks_cancelled=cancelled)
    start_waiting_runs(run.policy)
    return run


@transaction.atomic
def supersede_run(run: Run, *, actor="worker") -> bool:
    """active → superseded: the run's policy version is no longer the approved one, so no
    further chunk of it may commit. The worker calls this inside its chunk transaction when
    the decision fence shows the approval moved on (rare); a run that already left ``active``
    is left alone. True when this call superseded it."""
    reason = f"policy version v{run.policy_version.number} is no longer approved"
    changed = Run.objects.filter(pk=run.pk, state=Run.State.ACTIVE).update(
        state=Run.State.SUPERSEDED, state_reason=reason, finished_at=timezone.now()
    )
    if changed:
        record_action(actor, "run.supersede", run, reason=reason)
    return bool(changed)


def run_needs_attention(run: Run, *, actor, reason: str) -> bool:
    """active → attention: something the run cannot get past by itself (a permanent planning
    error). A run that already left ``active`` is left alone; True when this call moved it.
    Written in the caller's transaction, with its operator-log row (a system actor:
    ``worker``)."""
    reason = reason[:2000]
    moved = Run.objects.filter(pk=run.pk, state=Run.State.ACTIVE).update(
        state=Run.State.ATTENTION, state_reason=reason
    )
    if moved:
        record_action(actor, "run.attention", run, reason=reason)
    return bool(moved)


def verification_reason(result: dict) -> str:
    """A drained run's state reason from its verification: what it left and why, counts
    with thousands separators."""
    held, nulls = result["deferred_by_holds"], result.get("not_eligible_null", 0)
    notes = [f"{held:,} row(s) deferred by legal holds"] if held else []
    blocked = result.get("deferred_by_cascades", 0)
    if blocked:
        notes.append(f"{blocked:,} row(s) deferred: their cascade would reach protected rows")
    referenced = result.get("kept_referenced", 0)
    causes = result.get("kept_referenced_by") or []
    if referenced:
        notes.append(
            f"{referenced:,} row(s) kept: referenced by a row that stays"
            + (f" ({'; '.join(cascades.Cause.text(c) for c in causes)})" if causes else "")
        )
    elif causes:  # beside a cascade guard: the referenced rows are among those deferred
        notes.append(
            f"kept: referenced by a row that stays ({'; '.join(cascades.Cause.text(c) for c in causes)})"
        )
    if nulls:
        notes.append(f"{nulls:,} row(s) not eligible: NULL timestamp, key or tenant")
    for d in result.get("discarded", []):
        notes.append(f"{d['rows']:,} row(s) discarded by {d['by']} ({d['why']})")
    return "; ".join(["verified: no eligible row left", *notes])


def _triggers_note(result: dict) -> str:
    """Where the rows left may come from: BEFORE DELETE triggers that skip rows they keep."""
    triggers = result.get("before_delete_triggers")
    if not triggers:
        return ""
    kept = result.get("kept_by_triggers")
    if kept:  # counted by the chunks' DELETEs (their audit records)
        return (
            f" ({kept:,} row(s) kept by BEFORE DELETE trigger(s) {', '.join(triggers)}, which "
            f"returned NULL for them)"
        )
    return (
        f" (kept by a trigger? BEFORE DELETE trigger(s) {', '.join(triggers)} keep every row "
        f"they return NULL for)"
    )


def conclude_pass(run: Run, result: dict, *, open_letters: int, actor="reconciler") -> str:
    """After a pass's verification (``result``; the run row locked by the caller): drained,
    another pass, or attention — with one operator-log row saying which (``run.drained``,
    ``run.next_pass``, ``run.attention``). Returns the new state."""
    run.verification = result
    if open_letters:
        run.state = Run.State.ATTENTION
        run.state_reason = f"{open_letters} dead-lettered chunk(s) need a decision"
    elif "error" in result:
        run.state = Run.State.ATTENTION
        run.state_reason = f"verification failed: {result['error']}"
    elif result["remaining"] == 0:
        run.state = Run.State.DRAINED
        run.state_reason = verification_reason(result)
        if run.slice_bound is not None:  # a slice run verified what it may delete, no more
            run.state_reason = run.state_reason.replace(
                "no eligible row left",
                f"no eligible row older than the slice bound {run.slice_bound:%Y-%m-%d %H:%M} left",
                1,
            )
        run.finished_at = timezone.now()
    elif run.pass_no < run.policy_version.parsed.max_passes:
        run.pass_no += 1
        run.planner_done = False
        run.state_reason = f"pass {run.pass_no}: {result['remaining']:,} eligible row(s) remained after pass {run.pass_no - 1}{_triggers_note(result)}"
    else:
        run.state = Run.State.ATTENTION
        run.state_reason = (
            f"{result['remaining']:,} eligible row(s) remain after {run.pass_no} passes"
            f"{_triggers_note(result)}"
        )
    run.save(
        update_fields=[
            "state",
            "state_reason",
            "verification",
            "finished_at",
            "pass_no",
            "planner_done",
        ]
    )
    record_action(
        actor,
        "run.next_pass" if run.state == Run.State.ACTIVE else f"run.{run.state}",
        run,
        reason=run.state_reason,
        **{"pass": run.pass_no, "remaining": result.get("remaining")},
    )
    return run.state


def conclude_count(run: Run, *, open_letters: int, actor="reconciler") -> str:
    """A count run whose chunks are all counted (the run row locked by the caller): counted,
    its totals (``runs.counts``) in its verification and state reason — or attention while a
    chunk's count is dead-lettered (a count with a hole is no count). Nothing is verified:
    nothing was deleted. One operator-log row (``run.counted``). Returns the new state."""
    if open_letters:
        run.state = Run.State.ATTENTION
        run.state_reason = f"{open_letters} dead-lettered chunk(s) need a decision"
        run.save(update_fields=["state", "state_reason"])
        record_action(actor, "run.attention", run, reason=run.state_reason)
        return run.state
    totals = count_totals(run)
    run.verification = {
        "rows_counted": totals["rows"],
        "kept": totals["kept"],
        "deferred_by_holds": totals["held"],
        "deferred_by_cascades": totals["cascade"],
        "checked_at": timezone.now().isoformat(),
        "pass": run.pass_no,
    }
    run.state = Run.State.COUNTED
    run.state_reason = count_reason(totals)
    run.finished_at = timezone.now()
    run.save(update_fields=["state", "state_reason", "verification", "finished_at"])
    record_action(actor, "run.counted", run, reason=run.state_reason, rows_counted=totals["rows"])
    return run.state


def count_reason(totals: dict) -> str:
    """A counted run's state reason: what a full run would delete, and what it would leave."""
    notes = [f"counted: a full run would delete {totals['rows']:,} row(s); nothing deleted"]
    if totals["kept"]:
        notes.append(f"{totals['kept']:,} kept by keep rules")
    if totals["held"]:
        notes.append(f"{totals['held']:,} deferred by legal holds")
    if totals["cascade"]:
        notes.append(f"{totals['cascade']:,} deferred: their cascade would reach protected rows")
    return "; ".join(notes)


def _resolve_open_letter(letter: DeadLetter, resolution: str, *, actor, reason: str) -> DeadLetter:
    """Lock an open dead letter and record the decision on it (inside the caller's transaction)."""
    _check_oncall(actor)
    reason = require_reason(reason, "resolving a dead letter")
    letter = DeadLetter.objects.select_for_update().get(pk=letter.pk)
    if letter.resolution != DeadLetter.Resolution.OPEN:
        raise ActionError(f"dead letter #{letter.pk} is already {letter.resolution}")
    letter.resolution = resolution
    letter.resolved_by, letter.resolved_at, letter.resolution_reason = (
        _actor_name(actor),
        timezone.now(),
        reason,
    )
    letter.save(update_fields=["resolution", "resolved_by", "resolved_at", "resolution_reason"])
    return letter


def _replay_one(
    letter: DeadLetter, *, actor, reason: str, reset_attempts: bool = True
) -> Run | None:
    """Put one open dead letter's chunk back (inside the caller's transaction); its run."""
    letter = _resolve_open_letter(
        letter, DeadLetter.Resolution.REPLAYED, actor=actor, reason=reason
    )
    if letter.chunk_id:
        chunk = Chunk.objects.select_for_update().get(pk=letter.chunk_id)
        chunk.state, chunk.not_before, chunk.claimed_at = (
            Chunk.State.PENDING,
            timezone.now(),
            None,
        )
        if reset_attempts:
            chunk.attempts = 0
        chunk.save(update_fields=["state", "attempts", "not_before", "claimed_at"])
    if _partition_of(letter) is not None:  # the partition is tried again at once
        PartitionAction.objects.filter(
            pk=_partition_of(letter), state=PartitionAction.State.DETACHING
        ).update(attempts=0, not_before=None)
    return letter.run


def _go_on(runs: dict[int, Run], *, attention_only_when_clear: bool) -> None:
    """After letters were decided: each of their runs that needs attention (and, for
    discards, has no open letter left) goes on, and every open run's chunks are admissible
    now — one fresh lease generation per slot, whatever the number of letters."""
    for run in runs.values():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.state not in (Run.State.ATTENTION, Run.State.ACTIVE):
            continue
        if run.state == Run.State.ATTENTION:
            if (
                attention_only_when_clear
                and DeadLetter.objects.filter(
                    run=run, resolution=DeadLetter.Resolution.OPEN
                ).exists()
            ):
                continue
            run.state, run.state_reason = Run.State.ACTIVE, ""
            run.save(update_fields=["state", "state_reason"])
        Chunk.objects.pending().filter(run=run, not_before__gt=timezone.now()).update(
            not_before=timezone.now()
        )
        dispatch.republish_all(run)


@transaction.atomic
def replay_dead_letter(letter: DeadLetter, *, actor, reason: str) -> Chunk | None:
    """Put the dead-lettered chunk back, with the same identity and scope."""
    run = _replay_one(letter, actor=actor, reason=reason)
    letter.refresh_from_db()
    record_action(actor, "dead_letter.replay", letter, reason=reason, chunk=letter.chunk_id)
    if run is not None:
        _go_on({run.pk: run}, attention_only_when_clear=False)
    return Chunk.objects.get(pk=letter.chunk_id) if letter.chunk_id else None


def _discard_one(letter: DeadLetter, *, actor, reason: str) -> tuple[DeadLetter, str]:
    """Give up on one open dead letter (inside the caller's transaction): the letter and the
    partition it keeps detached ('' for none)."""
    letter = _resolve_open_letter(
        letter, DeadLetter.Resolution.DISCARDED, actor=actor, reason=reason
    )
    if letter.run_id is not None and letter.chunk_id is not None:
        list(Run.objects.select_for_update().filter(pk=letter.run_id))  # serializes discards
        discarded = DeadLetter.objects.filter(
            run_id=letter.run_id, resolution=DeadLetter.Resolution.DISCARDED
        ).exclude(chunk=None)
        if discarded.count() > MAX_DISCARDED_SCOPES:  # this one included: raising undoes it
            raise ActionError(
                f"run #{letter.run_id} already excludes {MAX_DISCARDED_SCOPES} discarded scopes,"
                " the most a run can: cancel the run, or remove the cause and replay"
            )
    return letter, _keep_partition_detached(letter, actor=actor, reason=reason)


@transaction.atomic
def discard_dead_letter(letter: DeadLetter, *, actor, reason: str) -> DeadLetter:
    """Give up on the chunk: it stays dead, its rows stay; the decision is on record. Its scope
    is left out of the run's later passes, their DELETEs and its verification; a run excludes
    at most ``MAX_DISCARDED_SCOPES`` scopes, so discarding one more is refused (cancel the run,
    or remove the cause and replay)."""
    letter, kept = _discard_one(letter, actor=actor, reason=reason)
    record_action(
        actor, "dead_letter.discard", letter, reason=reason, chunk=letter.chunk_id,
        **({"partition": kept} if kept else {}),
    )  # fmt: skip
    run = letter.run
    if run is not None and run.state == Run.State.ATTENTION:
        # the last open decision made: the run goes on to its verification, where the
        # discarded scope is reported and no longer counts as remaining
        _go_on({run.pk: run}, attention_only_when_clear=True)
    return letter


def filter_letters(
    letters, *, run: Run | None = None, cause: str = "", table: str = "", policy: str = ""
):
    """Dead letters of a run, a cause (a SQLSTATE such as ``42703``, or the whole cause
    ``42703 status``), a table (``orders`` or ``public.orders``) and a policy, oldest first."""
    if run is not None:
        letters = letters.filter(run=run)
    if cause:
        letters = letters.filter(Q(sqlstate=cause) | Q(context__cause=cause))
    if table:
        letters = letters.filter(Q(context__table=table) | Q(context__table__endswith=f".{table}"))
    if policy:
        letters = letters.filter(run__policy__slug=policy)
    return letters.order_by("pk")


def open_letters_matching(
    *, run: Run | None = None, cause: str = "", table: str = "", policy: str = ""
):
    """The open dead letters a bulk decision names (``filter_letters``)."""
    letters = DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN).select_related("run")
    return filter_letters(letters, run=run, cause=cause, table=table, policy=policy)


def _batch_target(letters: list[DeadLetter]):
    runs = {letter.run_id for letter in letters}
    if len(runs) == 1 and letters[0].run is not None:
        return letters[0].run
    return letters[0]


@transaction.atomic
def replay_dead_letters(letters, *, actor, reason: str) -> list[int]:
    """Replay every letter of ``letters`` with one reason, all or none, on one operator-log
    row that lists their ids; each run they belong to is admitted at once (one fresh lease
    generation per slot, not one per letter). Returns the ids."""
    _check_oncall(actor)
    reason = require_reason(reason, "replaying dead letters")
    letters = list(letters)
    if not letters:
        raise ActionError("no open dead letter matches")
    runs: dict[int, Run] = {}
    for letter in letters:
        run = _replay_one(letter, actor=actor, reason=reason)
        if run is not None:
            runs[run.pk] = run
    ids = [letter.pk for letter in letters]
    record_action(
        actor, "dead_letter.replay_many", _batch_target(letters), reason=reason,
        dead_letters=ids, runs=sorted({r.run_key for r in runs.values()}),
    )  # fmt: skip
    _go_on(runs, attention_only_when_clear=False)
    return ids


@transaction.atomic
def discard_dead_letters(letters, *, actor, reason: str) -> list[int]:
    """Discard every letter of ``letters`` with one reason, all or none, on one operator-log
    row that lists their ids. Returns the ids."""
    _check_oncall(actor)
    reason = require_reason(reason, "discarding dead letters")
    letters = list(letters)
    if not letters:
        raise ActionError("no open dead letter matches")
    runs: dict[int, Run] = {}
    kept = []
    for letter in letters:
        letter, partition = _discard_one(letter, actor=actor, reason=reason)
        kept += [partition] if partition else []
        if letter.run is not None:
            runs[letter.run_id] = letter.run
    ids = [letter.pk for letter in letters]
    record_action(
        actor, "dead_letter.discard_many", _batch_target(letters), reason=reason,
        dead_letters=ids, runs=sorted({r.run_key for r in runs.values()}),
        **({"partitions": kept} if kept else {}),
    )  # fmt: skip
    _go_on(runs, attention_only_when_clear=True)
    return ids


@transaction.atomic
def retry_run(run: Run, *, actor, reason: str, expected: str | None = None) -> Run:
    """After on-call fixed a run-level cause (the circuit breaker's, ``runs.engine.breaker``;
    a planning failure): replay the run's open dead letters of run-level causes — permanent,
    not a row's (class 23) and not a partition's, which stay for a person — and resume it,
    every pending chunk admissible at once. One operator-log row names the letters."""
    _check_oncall(actor)
    reason = require_reason(reason, "retrying a run")
    run = Run.objects.select_for_update().get(pk=run.pk)
    _check_run_decision(run, expected)
    letters = [
        letter
        for letter in DeadLetter.objects.filter(
            run=run, resolution=DeadLetter.Resolution.OPEN, error_class="permanent"
        ).order_by("pk")
        if not letter.sqlstate.startswith("23")
        and (letter.context or {}).get("stage") != "partition"
    ]
    if run.state not in (Run.State.ATTENTION, Run.State.ACTIVE) or (
        run.state == Run.State.ACTIVE and not letters
    ):
        raise ActionError(
            f"run {run.run_key} is {run.state}; only a run needing attention, or an active one "
            "with dead letters of a run-level cause, can be retried"
        )
    cause = run.state_reason
    for letter in letters:
        _replay_one(letter, actor=actor, reason=reason, reset_attempts=False)
    record_action(
        actor, "run.retry", run, reason=reason,
        dead_letters=[letter.pk for letter in letters], cause=cause[:500],
    )  # fmt: skip
    _go_on({run.pk: run}, attention_only_when_clear=False)
    run.refresh_from_db()
    return run


def _partition_of(letter: DeadLetter) -> int | None:
    """The detaching partition (its ``PartitionAction`` id) a partition dead letter is about."""
    context = letter.context or {}
    if context.get("stage") != "partition":
        return None
    return context.get("partition_action")


def _keep_partition_detached(letter: DeadLetter, *, actor, reason: str) -> str:
    """Discarding a partition's dead letter keeps the partition detached, on the record: the
    run goes on without it; its rows are neither deleted nor audited (the evidence lists it,
    state ``kept``). Returns the partition's name ('' for any other letter)."""
    action_id = _partition_of(letter)
    if action_id is None:
        return ""
    action = PartitionAction.objects.select_for_update().filter(pk=action_id).first()
    if action is None or action.state != PartitionAction.State.DETACHING:
        return ""
    rows = f"{action.rows:,} row(s)" if action.rows is not None else "its rows"
    action.state = PartitionAction.State.KEPT
    action.note = (
        f"kept detached by {_actor_name(actor)}: {reason} — {rows} stay in {action.schema}."
        f"{action.name}, not audited (neither deleted nor dropped by this run) and not visible"
        " to the application"
    )[:2000]
    action.done_at = timezone.now()
    action.save(update_fields=["state", "note", "done_at"])
    return f"{action.schema}.{action.name}"


@transaction.atomic
def set_kill_switch(on: bool, *, actor, reason: str, expected: str | None = None) -> KillSwitch:
    """Flip the global kill switch. On: no chunk is admitted anywhere. Off: leases restart."""
    _check_oncall(actor)
    reason = require_reason(reason, "switching the kill switch")
    if on:
        decision_fence()  # every chunk in flight commits first; none starts after the switch
    switch, _ = KillSwitch.objects.select_for_update().get_or_create(name="global")
    try:
        check_decision(switch, expected, now_is=switch.describe())
    except StaleDecision as exc:
        raise StaleDecision(f"the kill switch {exc}") from None
    switch.on, switch.reason, switch.changed_by, switch.changed_at = (
        on,
        reason,
        _actor_name(actor),
        timezone.now(),
    )
    switch.save()
    record_action(actor, "kill_switch.on" if on else "kill_switch.off", switch, reason=reason)
    if not on:
        for run in Run.objects.filter(state=Run.State.ACTIVE, policy__paused=False):
            dispatch.republish_all(run)
    return switch


def supersede_open_runs(policy: Policy, *, keep_version_id: int, actor, reason: str) -> list[Run]:
    """Approving a version ends every open run of the policy's older versions (they can never
    run again): superseded, pending chunks cancelled, each on the operator log. Call it inside
    the approval's transaction, after its decision fence."""
    ended = []
    for run in (
        Run.objects.select_for_update()
        .filter(policy=policy, state__in=Run.OPEN)
        .exclude(policy_version_id=keep_version_id)
    ):
        cancelled = Chunk.objects.pending().filter(run=run).update(state=Chunk.State.CANCELLED)
        run.state, run.state_reason = Run.State.SUPERSEDED, f"superseded: {reason}"
        run.finished_at = timezone.now()
        run.save(update_fields=["state", "state_reason", "finished_at"])
        record_action(actor, "run.supersede", run, reason=reason, chunks_cancelled=cancelled)
        ended.append(run)
    return ended


def expire_confirm_holds(policy: Policy, now: datetime, *, expiry_s: float) -> list[Run]:
    """A run held for confirmation and not confirmed within ``expiry_s`` expires (terminal,
    on the operator log); the policy's next run then goes through admission afresh."""
    expired = []
    for run in Run.objects.select_for_update().filter(
        policy=policy, state=Run.State.CONFIRM, held_at__lt=now - timedelta(seconds=expiry_s)
    ):
        reason = f"expired: not confirmed within {expiry_s / 3600:g} h of being held"
        _set_state(run, Run.State.EXPIRED, reason)
        run.finished_at = timezone.now()
        run.save(update_fields=["finished_at"])
        record_action("reconciler", "run.expire", run, reason=reason)
        expired.append(run)
    return expired


BLOCKING = (Run.State.ACTIVE, Run.State.PAUSED, Run.State.ATTENTION, Run.State.CONFIRM)


def start_waiting_runs(
    policy: Policy, *, actor="reconciler", reason: str = "the earlier run finished"
) -> Run | None:
    """Admit the policy's waiting run when no other open run blocks it (admission includes
    the blast-radius check); otherwise make its reason name the run it waits for."""
    waiting = fold_waiting_runs(policy, actor=actor)
    if waiting is None:
        return None
    blocker = (
        Run.objects.filter(policy=policy, state__in=BLOCKING)
        .exclude(pk=waiting.pk)
        .order_by("tick")
        .first()
    )
    if blocker is not None:
        why = f"waiting for run {blocker.run_key} ({blocker.state})"
        if waiting.state_reason != why:
            Run.objects.filter(pk=waiting.pk).update(state_reason=why)
        return waiting
    return admit(waiting, actor=actor, reason=reason)


def restart_runs(policy: Policy, *, reason: str) -> None:
    """Work resumes at once: fresh leases for the policy's active runs (not after the stale-lease
    interval), and its waiting run is admitted if nothing blocks it."""
    if not KillSwitch.is_on():
        for run in Run.objects.filter(policy=policy, state=Run.State.ACTIVE).select_related(
            "policy_version"
        ):
            dispatch.republish_all(run)
    start_waiting_runs(policy, actor="scheduler", reason=reason)


def follow_policy_decision(sender, *, policy: Policy, decision: str, actor, version=None, **_):
    """A policy decision's consequences for runs, in the decision's own transaction
    (``retention.signals.policy_decided``; connected in ``runs.apps``)."""
    if decision == "approved":
        supersede_open_runs(
            policy, keep_version_id=version.pk, actor=actor,
            reason=f"v{version.number} was approved; runs of older versions can never run again",
        )  # fmt: skip
    sync_policy_schedule(policy)
    if decision in ("resumed", "enabled"):
        restart_runs(policy, reason=f"policy {policy.slug} resumed")
