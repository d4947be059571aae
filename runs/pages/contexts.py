"""What the dashboard pages show: the per-policy overview and a run's page.

Every progress figure comes from ``runs.progress``; chart shapes from ``runs.pages.charts``.
Everything is read with a fixed number of aggregate queries per page (grouped in
SQL, never per chunk or per audit row in Python), plus one call per policy to the
guard and drain-window interfaces, so the pages stay fast with millions of rows.
Durations are seconds here; templates format them with the ``duration`` filter.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone
from django_q.models import Schedule

from core import timeouts
from core.filters import QueryFilters
from core.formatting import in_words, natural_key
from core.models import OperatorAction
from retention import partitions, predicate
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion
from retention.periods import label as period_line
from retention.periods import periods as periods_of
from retention.schedule_math import period_label
from retention.spec import parse_retention
from runs import counts, forecast
from runs.actions import verification_reason
from runs.engine import guard
from runs.engine.schedules import schedule_name
from runs.evidence import archives, audit
from runs.fleet import view as fleet_view
from runs.models import AuditRecord, Chunk, DeadLetter, Lease, Run, discarded_scopes
from runs.pages import charts
from runs.progress import broker_backlog, progress_for, stopped_by, tenant_table
from runs.status import health_of
from targets import connections as fleet_connections

# Policy states as the overview names them (and colours them: see app.css .state-*).
ACTIVE, PAUSED, AWAITING, ATTENTION, DISABLED, STOPPED = (
    "active",
    "paused",
    "awaiting approval",
    "needs attention",
    "disabled",
    "stopped by the kill switch",
)


def _age(now, then) -> float | None:
    return (now - then).total_seconds() if then else None


def _current_and_latest_runs(policy_ids: list[int]) -> tuple[dict[int, Run], dict[int, Run]]:
    """Per policy: the open run being worked (oldest open tick) and the latest run."""
    runs = Run.objects.filter(policy_id__in=policy_ids)
    latest = {
        r.policy_id: r
        for r in runs.order_by("policy_id", "-tick", "-id")
        .distinct("policy_id")
        .select_related("policy_version", "policy")
    }
    current = {
        r.policy_id: r
        for r in runs.filter(state__in=Run.OPEN)
        .exclude(state=Run.State.WAITING)
        .order_by("policy_id", "tick", "id")
        .distinct("policy_id")
        .select_related("policy_version", "policy")
    }
    for policy_id, run in latest.items():
        current.setdefault(policy_id, run)
    return current, latest


@dataclass
class PolicyReadings:
    """What a page listing several policies reads once for all of them (the overview,
    /metrics): each policy's open run being worked and latest run, their progress, the kill
    switch, each approved version with its guard controller row, the guard's latest sample,
    the tick each schedule is armed for, the broker's backlog, each drain window's cached
    measurement and each target table's probe window."""

    current: dict[int, Run]
    latest: dict[int, Run]
    progress: dict
    kill_switch: KillSwitch | None
    approved: dict[int, PolicyVersion]
    controls: dict
    sample: object
    next_runs: dict[str, object]
    broker: object
    measured: dict[int, dict | None]
    probes: dict[str, dict]

    def drain_window(self, policy) -> dict:
        return forecast.drain_window(
            policy,
            progress=self.progress,
            latest_run=self.latest.get(policy.id),
            next_tick=self.next_runs.get(schedule_name(policy)),
            kill_switch=self.kill_switch,
            measured=self.measured.get(policy.id),
            control=self.controls.get(policy.id),
        )

    def guard_state(self, policy) -> dict:
        return guard.current_state(
            policy,
            version=self.approved.get(policy.id),
            latest=self.sample,
            control=self.controls.get(policy.id),
            probes=self.probes.get(self.approved[policy.id].parsed.qualified_table)
            if policy.id in self.approved
            else None,
        )


def policy_readings(policies: list[Policy], now) -> PolicyReadings:
    ids = [p.id for p in policies]
    current, latest = _current_and_latest_runs(ids)
    broker = broker_backlog(now)
    switch = KillSwitch.objects.filter(name="global").first()
    progress = progress_for(current.values(), now=now, broker=broker, kill_switch=switch)
    approved = {
        v.policy_id: v
        for v in PolicyVersion.objects.filter(policy_id__in=ids, state=PolicyVersion.State.APPROVED)
        .select_related("policy__guard_control")
        .order_by("policy_id", "-number")
        .distinct("policy_id")
    }  # one query for every policy's approved version (the guard's thresholds, the backlog
    # SLO) and the guard's latency controller (its row, when it has stepped)
    next_runs = dict(
        Schedule.objects.filter(name__in=[schedule_name(p) for p in policies]).values_list(
            "name", "next_run"
        )
    )
    return PolicyReadings(
        current=current,
        latest=latest,
        progress=progress,
        kill_switch=switch,
        approved=approved,
        controls={pid: guard.control_of(v.policy) for pid, v in approved.items()},
        sample=guard.latest_sample(),
        next_runs=next_runs,
        broker=broker,
        measured=forecast.measurements(policies),
        probes=guard.probe_windows(v.parsed.qualified_table for v in approved.values()),
    )


def policy_state(policy: Policy, run: Run | None, dead_letters: int, guard_level: str) -> str:
    if not policy.enabled:
        return DISABLED
    if not policy.has_approved:
        return AWAITING
    if (
        dead_letters
        or guard_level == "critical"
        or (run and run.state in (Run.State.ATTENTION, Run.State.CONFIRM))
    ):
        return ATTENTION
    if policy.paused or (run and run.state == Run.State.PAUSED):
        return PAUSED
    return ACTIVE


def overview_context(request) -> dict:
    now = timezone.now()
    read = QueryFilters(request.GET)
    slug = read.text("policy")
    policies_qs = Policy.objects.annotate(
        has_approved=Exists(
            PolicyVersion.objects.filter(policy=OuterRef("pk"), state=PolicyVersion.State.APPROVED)
        ),
        has_submitted=Exists(
            PolicyVersion.objects.filter(policy=OuterRef("pk"), state=PolicyVersion.State.SUBMITTED)
        ),
    )
    if slug:
        policies_qs = policies_qs.filter(slug=slug)
    if read.errors:
        policies_qs = policies_qs.none()
    policies = list(policies_qs)
    ids = [p.id for p in policies]
    r = policy_readings(policies, now)
    current, latest, switch, progress = r.current, r.latest, r.kill_switch, r.progress
    dead = dict(
        DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN, run__policy_id__in=ids)
        .values_list("run__policy_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    # policies over other targets: their convergence, read from each target's ledger
    fleet = fleet_view.fleet_of(
        policies,
        {
            pid: fleet_connections.resolve(version.parsed.targets)
            for pid, version in r.approved.items()
        },
    )
    rows = []
    for policy in policies:
        run = current.get(policy.id)
        p = progress.get(run.pk) if run else None
        # what stops an active run, in the words of its page and ``retention status``
        # (``health_of`` says this first; its other readings cost queries per run)
        health = (
            stopped_by(run, policy, switch)
            if run is not None and run.state == Run.State.ACTIVE
            else None
        )
        window = r.drain_window(policy)
        guard_state = r.guard_state(policy)
        dead_n = dead.get(policy.id, 0)
        eta = p.eta_s if p else window.get("eta_s")
        throttle = (p.throttle_reason if p else "") or "; ".join(guard_state.get("reasons") or [])
        state = policy_state(policy, run, dead_n, guard_state.get("level", "ok"))
        if state == ACTIVE and switch is not None and switch.on:
            state = STOPPED  # nothing of it is admitted: not "active" in green
        rows.append(
            {
                "policy": policy,
                "state": state,
                "run": run,
                "last_run": latest.get(policy.id),
                "progress": p,
                "health": health,
                "eta_s": eta,
                "next_run": r.next_runs.get(schedule_name(policy)),
                "window": window,
                # how far behind the policy is: the oldest eligible row's age minus the
                # retention (forecast's overdue_s); the oldest row's own age is the detail
                "backlog_age_s": window.get("overdue_s"),
                "oldest_age_s": window.get("oldest_eligible_age_s"),
                "slo": backlog_slo(
                    r.approved[policy.id].spec.get("max_backlog_age")
                    if policy.id in r.approved
                    else None,
                    window,
                ),
                "guard": guard_state,
                "throttle_reason": throttle,
                "dead_letters": dead_n,
                "fleet": fleet.get(policy.id),
            }
        )
    known = []
    closest = []
    if slug and not rows:  # an unknown slug: the closest ones, and every policy
        known = list(Policy.objects.order_by("slug").values_list("slug", "name"))
        closest = difflib.get_close_matches(slug, [k for k, _ in known], n=3, cutoff=0.5)
    return {
        "policy_rows": rows,
        "policy_filter": slug,
        "closest_policies": closest,
        "known_policies": known,
        "filter_errors": read.errors,
        "kill_switch": switch,
        "kill_switch_on": bool(switch and switch.on),
        # what turning the switch on stops (its confirmation says so)
        # (every policy's: a filtered overview counts them with one query)
        "active_runs": Run.objects.filter(state=Run.State.ACTIVE).count()
        if slug
        else sum(1 for r in rows if r["run"] and r["run"].state == Run.State.ACTIVE),
        "kill_switch_token": switch.decision_token if switch else "off:0",
        "broker": r.broker,
        "now": now,
    }


def policy_fleet_context(policy: Policy) -> dict:
    """A policy's targets as its page shows them: the overview's fleet reading
    (``runs.fleet.view.fleet_of``, never waiting on a target) for this one policy. ``fleet``
    is None for a policy without an approved version or over the control database only."""
    version = (
        PolicyVersion.objects.filter(policy=policy, state=PolicyVersion.State.APPROVED)
        .order_by("-number")
        .first()
    )
    names = fleet_connections.resolve(version.parsed.targets) if version else []
    fleet = fleet_view.fleet_of([policy], {policy.id: names}) if version else {}
    return {
        "policy": policy,
        "fleet": fleet.get(policy.id),
        "targets": list(version.parsed.targets) if version else [],
    }


def backlog_slo(max_backlog_age: str | None, window: dict) -> dict | None:
    """The policy's backlog SLO against how long its oldest eligible row is overdue
    (None when the approved version sets no SLO)."""
    if not max_backlog_age:
        return None
    limit = parse_retention(max_backlog_age).total_seconds()
    overdue = window.get("overdue_s")
    return {
        "limit": max_backlog_age,
        "overdue_s": max(0, overdue) if overdue is not None else None,
        "met": overdue is None or overdue <= limit,
    }


# ---------------------------------------------------------------- run page

# What the reconciler's verification (``reconciler.verify``) found, in the order a person reads
# it; a key not listed here is shown under its own name after these.
VERIFICATION_LABELS = {
    "error": "Verification failed",
    "remaining": "Eligible rows left",
    # a count run's (``actions.conclude_count``): nothing deleted, nothing left to verify
    "rows_counted": "Rows a full run would delete (counted)",
    "kept": "Kept by keep rules",
    "deferred_by_holds": "Deferred by legal holds",
    "deferred_by_cascades": "Deferred: their cascade would reach protected rows",
    "holds": "Legal holds in force",
    "not_eligible_null": "Not eligible (NULL timestamp, key or tenant)",
    "limit": "Counts stop at",
    "read": "Read",  # what the verification read: what the pass may have missed, or all
    "pass": "After pass",
    "checked_at": "Checked at",
    # what the run left for VACUUM (``runs.engine.maintenance``), once it drained
    "dead_tuples": "Dead tuples on the target",
    "live_tuples": "Live tuples on the target",
    "vacuum_note": "Vacuum",
    "vacuum_started_at": "Vacuum started",
    "vacuum_finished_at": "Vacuum finished",
}
VERIFICATION_TEXT = {"error", "vacuum_note", "read"}
VERIFICATION_WHEN = {"checked_at", "vacuum_started_at", "vacuum_finished_at"}
# shown by other rows: the discarded scopes' table, the policy's setting and the vacuum's
# state (both in the "Vacuum" sentence); where a next pass plans (``missed``: the "Read" row
# says where the verification looked)
VERIFICATION_HIDDEN = {"discarded", "vacuum", "vacuum_state", "missed"}


def verification_items(result: dict | None) -> dict | None:
    """The run's verification as label/value rows plus its discarded scopes (None when the run
    was not verified yet). Values keep their type; the template formats numbers and instants."""
    if not result:
        return None
    rows = []
    for key, label in VERIFICATION_LABELS.items():
        if key == "holds" and key in result:
            ids = ", ".join(f"#{pk}" for pk in result[key]) or "none"
            rows.append({"label": label, "value": ids, "kind": "text"})
        elif key in result:
            value = result[key]
            kind = (
                "when"
                if key in VERIFICATION_WHEN
                else ("text" if key in VERIFICATION_TEXT else "number")
            )
            if isinstance(value, dict | list) or (kind == "number" and not _countable(value)):
                value, kind = in_words(value), "text"  # a mapping in words, never a repr
            rows.append({"label": label, "value": value, "kind": kind})
    for key, value in result.items():
        if key not in VERIFICATION_LABELS and key not in VERIFICATION_HIDDEN:
            rows.append({"label": key.replace("_", " "), "value": in_words(value), "kind": "text"})
    return {
        "rows": rows,
        "discarded": list(result.get("discarded") or []),
        "summary": _verified_in_words(result),
    }


def _countable(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _verified_in_words(result: dict) -> str:
    """The verification as one sentence: what it found left, and why rows stay."""
    if result.get("error"):
        return f"Verification failed: {result['error']}"
    if "remaining" not in result:
        return ""
    left = result["remaining"] or 0
    if left:
        return f"Verification found {left:,} eligible row(s) left."
    try:
        reason = verification_reason(result)
    except (KeyError, TypeError):
        reason = "verified: no eligible row left"
    return f"{reason[:1].upper()}{reason[1:]}."


HELD_COUNT_TIMEOUT_MS = 2_000
HELD_COUNT_LIMIT = 100_000
TIMED_OUT = ("57014", "55P03")  # statement timeout / lock timeout


def held_by_tenant(run: Run, holds: list) -> dict:
    """Rows of this run that the active legal holds defer, per tenant, counted now against the
    table under the run's cutoff and discarded scopes (``predicate.held_by_tenant``: one query,
    at most ``HELD_COUNT_LIMIT`` rows read, under a statement timeout). ``status`` is
    "counted", "timeout", "error" or "none" (no active hold: nothing to count)."""
    if not holds:
        return {"status": "none", "rows": [], "capped": False}
    spec = run.policy_version.parsed
    frag = predicate.held_by_tenant(
        spec,
        policy_id=run.policy_id,
        cutoff=run.bound,
        outside=discarded_scopes(run),
        limit=HELD_COUNT_LIMIT,
    )
    try:
        with transaction.atomic(), timeouts.bounded(HELD_COUNT_TIMEOUT_MS):
            with connection.cursor() as cur:
                cur.execute(frag.sql.as_string(cur.connection), frag.params)
                counted = cur.fetchall()
    except DatabaseError as exc:
        cause = getattr(exc, "__cause__", None)
        timed_out = getattr(cause, "sqlstate", None) in TIMED_OUT
        return {"status": "timeout" if timed_out else "error", "rows": [], "capped": False}
    rows = sorted(
        ({"tenant": tenant, "rows": n} for tenant, n in counted),
        key=lambda r: natural_key(r["tenant"] or ""),
    )
    total = sum(r["rows"] for r in rows)
    return {
        "status": "counted",
        "rows": rows,
        "capped": total >= HELD_COUNT_LIMIT,
        "limit": HELD_COUNT_LIMIT,
    }


def _partition_actions(run: Run, spec) -> list[dict]:
    """The run's partition actions, their bounds as people read them (an epoch timestamp's as
    instants: ``retention.partitions.shown_bounds_of``)."""
    actions = list(
        run.partition_actions.order_by("id").values(
            "schema", "name", "bounds", "state", "rows", "digest", "note", "chunk_id",
            "chunk__audit__chain_seq", "done_at",
        )
    )  # fmt: skip
    shown = partitions.shown_bounds_of(spec, [a["bounds"] for a in actions])
    for action, bounds in zip(actions, shown, strict=True):
        action["bounds"] = bounds
    return actions


ARCHIVE_OBJECTS_SHOWN = 50  # the rest are in the manifest and the CSV


def run_page_context(run: Run) -> dict:
    now = timezone.now()
    switch = KillSwitch.objects.filter(name="global").first()
    p = progress_for([run], now=now, kill_switch=switch)[run.pk]
    rates = charts.rate_series(run, span=(p.first_commit, p.last_commit))
    window = forecast.drain_window(run.policy, progress={run.pk: p})
    guard_state = guard.current_state(run.policy)
    last = (
        AuditRecord.objects.filter(run=run)
        .order_by("-chain_seq")
        .only(
            "chain_seq",
            "chunk_id",
            "tenant",
            "key_from",
            "key_to",
            "key_lo",
            "key_hi",
            "bound_columns",
            "rows_deleted",
            "committed_at",
        )  # fmt: skip
        .first()
    )
    spec = run.policy_version.parsed
    if last is not None:
        last.read_with(spec)  # an epoch timestamp's bounds read as instants
    troubled = list(
        Chunk.objects.filter(run=run)
        .troubled()
        .order_by("-not_before")
        .only(
            "id", "tenant", "key_from", "key_to", "lo", "hi", "state", "attempts", "not_before",
            "throttle_reason", "last_error", "last_sqlstate",
        )[:50]
    )  # fmt: skip
    troubled = [c.read_with(run) for c in troubled]
    letters = list(
        DeadLetter.objects.filter(run=run, resolution=DeadLetter.Resolution.OPEN).order_by(
            "-created_at"
        )[:20]
    )
    leases = list(Lease.objects.filter(run=run).order_by("slot"))
    holds = list(
        LegalHold.objects.filter(
            Q(policy_id=run.policy_id) | Q(policy__isnull=True), released_at__isnull=True
        ).order_by("placed_at")[:50]
    )
    held = held_by_tenant(run, holds)
    for lease in leases:
        lease.enqueued_age_s = _age(now, lease.enqueued_at)
        lease.heartbeat_age_s = _age(now, lease.heartbeat_at)
    return {
        "run": run,
        "period": period_label(run.policy, run.tick),
        # progressing, or why not (the same words as retention status: runs.status)
        "health": health_of(run, p, now, switch=switch),
        "progress": p,
        "window": window,
        "guard": guard_state,
        "guard_over_run": guard.run_budget(run),
        "last": last,
        "last_age_s": _age(now, last.committed_at) if last else None,
        "histogram": charts.state_histogram(p.chunks),
        "rates": rates,
        "rate_chart": charts.rate_chart(rates, pace=run.policy_version.parsed.pace_rows_per_s),
        "peak_rate": round(rates["peak"]),
        "verification": verification_items(run.verification),
        "troubled": troubled,
        "letters": letters,
        "leases": leases,
        # partitions taken whole (or left to the chunks), beside the chunks
        "partition_actions": _partition_actions(run, spec),
        # rows removed in each table the chunks' cascades reached (empty without cascades)
        "rows_by_table": audit.rows_by_table(run.pk),
        # archived before deleting: where, how many rows, and the first objects with digests
        "archive": (
            {
                "to": spec.archive_to,
                "rows": archives.archived_rows(run.pk),
                "objects": archives.run_objects(run.pk, limit=ARCHIVE_OBJECTS_SHOWN),
                "shown": ARCHIVE_OBJECTS_SHOWN,
            }
            if spec.archive_to
            or AuditRecord.objects.filter(run=run, archive__isnull=False).exists()
            else None
        ),
        "tenants": tenant_table(
            p,
            per_tenant_chunks=run.per_tenant(spec) or not spec.tenant,
            held={r["tenant"] or "": r["rows"] for r in held["rows"]},
        ),
        "kill_switch": switch if switch is not None and switch.on else None,
        "holds": holds,
        "held": held,
        "history": list(
            OperatorAction.objects.filter(target_type="run", target_id=str(run.pk)).order_by(
                "-chain_seq"
            )[:50]
        ),
        "broker": p.broker,
        "counted": counted_context(run),
        # the cutoff of each override and class of the version in this run (default first)
        "periods": [period_line(r) for r in periods_of(spec, run.bound)][1:],
        "now": now,
    }


def counted_context(run: Run) -> dict | None:
    """What a count run found so far (``runs.counts``), as the run page lists it: the totals,
    rows per tenant (largest first) and per month (oldest first). None for another run."""
    if not run.counts_only:
        return None
    totals = counts.count_totals(run)
    return {
        **totals,
        "tenant_rows": counts.shown(totals["tenants"]),
        "month_rows": counts.shown(totals["ages"], by_key=True),
    }
