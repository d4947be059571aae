"""State changes of policies, versions and legal holds.

Each function is one transaction that checks the actor's role, changes state and
writes its ``OperatorAction`` row (``record_action``) before it commits, so the
log never misses a change and never records one that rolled back. The CLI and
the views call these; neither saves a Policy itself.

Errors: ``SpecError`` (the specification or the table is wrong), ``ActionError``
(the change is not allowed now, e.g. approving one's own version) — both
``ValueError``s with a one-line message — and ``PermissionDenied`` (missing role).
"""

from __future__ import annotations

import contextlib

from django.db import transaction
from django.utils import timezone

from core.accounts import check_approver
from core.locks import decision_fence, hold_fence
from core.oplog import (
    ActionError,
    NeedsAnotherPerson,
    StaleDecision,
    check_decision,
    record_action,
    require_reason,
)
from core.roles import COMPLIANCE, ONCALL, check_role, check_role_or_system
from retention import cascades, decisions, floors, holds, introspect
from retention.models import LegalHold, Policy, PolicyVersion, RetentionFloor
from retention.preview import preview as take_preview
from retention.signals import policy_decided
from retention.spec import PolicySpec, SpecError, check_period
from targets import connections as fleet_connections

State = PolicyVersion.State


def _locked_version(version: PolicyVersion) -> PolicyVersion:
    """The version re-read under a row lock, with its policy locked first (one decision
    per policy at a time, in a fixed lock order)."""
    Policy.objects.select_for_update().get(pk=version.policy_id)
    return (
        PolicyVersion.objects.select_for_update(of=("self",))
        .select_related("policy", "author")
        .get(pk=version.pk)
    )


def _check_submission(version: PolicyVersion) -> None:
    """Four-eyes rests on who wrote and submitted the version: the submission's signature must
    verify, so a submitter or author changed with a database login alone decides nothing."""
    refusal = decisions.submission_refusal(version)
    if refusal:
        raise ActionError(refusal)


def _check_four_eyes(version: PolicyVersion, actor, verb: str) -> None:
    hand = version.hand_of(actor)
    if hand is not None:
        raise NeedsAnotherPerson(
            f"{actor.username} {hand} {version} and cannot {verb} it; "
            f"another member of compliance must"
        )


def on_validating_target(spec: PolicySpec):
    """Where a version's table is validated and previewed: on the control database for a
    policy of the control database (as always), else on the first of its targets (each
    target's own table is resolved again, in that target, when a run is triggered there)."""
    names = fleet_connections.resolve(spec.targets)
    if not names:
        raise ActionError(f"targets {list(spec.targets)} name no registered target")
    if names[0] == fleet_connections.DEFAULT:
        return contextlib.nullcontext()
    return fleet_connections.on(names[0])


@transaction.atomic
def apply_spec(spec: PolicySpec, *, author) -> PolicyVersion:
    """Create a draft version of ``spec`` (and its policy, if the slug is new).

    Idempotent by content hash: if the policy already has a draft, submitted or approved
    version with the same content, that version is returned unchanged. The spec is
    validated against the database first; nothing is written when it does not validate.
    """
    check_role(author, COMPLIANCE)
    with on_validating_target(spec):
        introspect.validate(spec)
    floors.check_version(spec)
    content_hash = spec.content_hash()
    policy = Policy.objects.select_for_update().filter(slug=spec.slug).first()
    if policy is None:
        policy = Policy.objects.create(
            slug=spec.slug,
            name=spec.name,
            owner=spec.owner or author.username,
            schedule=spec.schedule,
            timezone=spec.timezone,
        )
        record_action(author, "policy.create", policy, slug=policy.slug)
    existing = (
        policy.versions.filter(content_hash=content_hash)
        .exclude(state__in=(State.REJECTED, State.SUPERSEDED))
        .order_by("-number")
        .first()
    )
    if existing is not None:
        return existing
    last = policy.versions.order_by("-number").values_list("number", flat=True).first() or 0
    version = PolicyVersion.objects.create(
        policy=policy,
        number=last + 1,
        state=State.DRAFT,
        spec=spec.to_json(),
        content_hash=content_hash,
        author=author,
    )
    record_action(
        author, "version.create", version, number=version.number, content_hash=content_hash
    )
    return version


@transaction.atomic
def submit_version(version: PolicyVersion, *, actor, reason: str = "", now=None) -> PolicyVersion:
    """draft → submitted: validate against the live catalog and take the dry-run preview
    the approver will see. From here the version's content never changes. Needs a reason
    (refused here, so the CLI and the pages refuse alike)."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "submitting a version")
    version = _locked_version(version)
    if version.state != State.DRAFT:
        raise ActionError(f"{version} is {version.state}, only a draft can be submitted")
    spec = version.parsed
    if spec.content_hash() != version.content_hash:
        raise ActionError(f"{version}: stored content does not match its hash")
    with on_validating_target(spec):
        validation = introspect.validate(spec)
        preview = take_preview(spec, policy_id=version.policy_id, now=now, validation=validation)
    floors.check_version(spec)
    version.validation = validation.to_json()
    version.preview = preview
    version.state = State.SUBMITTED
    version.submitted_at = timezone.now()
    version.submitted_by = actor
    version.save(update_fields=["validation", "preview", "state", "submitted_at", "submitted_by"])
    decisions.sign_submission(version, actor)
    record_action(
        actor,
        "version.submit",
        version,
        reason=reason,
        number=version.number,
        content_hash=version.content_hash,
        preview_eligible=version.preview.get("eligible"),
        preview_cutoff=version.preview.get("cutoff"),
    )
    return version


@transaction.atomic
def approve_version(version: PolicyVersion, *, actor, reason: str = "") -> PolicyVersion:
    """submitted → approved, superseding the previously approved version in the same
    transaction. Never by anyone who wrote or submitted it; bound to the content hash and to the preview taken
    at submission. Needs a reason (refused here, so the CLI and the pages refuse alike).
    Copies name, schedule and timezone to the policy and syncs its schedule."""
    check_role(actor, COMPLIANCE)
    check_approver(actor)
    reason = require_reason(reason, "approving a version")
    if cascades.reached_by_cascades(version.parsed):
        # other policies' chunks whose DELETE cascades into this table judge its rows by the
        # approved version: every chunk in flight commits first (the global fence, taken
        # before the policy's, in the order chunks take them)
        decision_fence()
    decision_fence(version.policy_id)  # chunks of the old version in flight commit first
    version = _locked_version(version)
    if version.state != State.SUBMITTED:
        raise ActionError(f"{version} is {version.state}, only a submitted version can be approved")
    _check_four_eyes(version, actor, "approve")
    _check_submission(version)
    spec = version.parsed
    if spec.content_hash() != version.content_hash:
        raise ActionError(f"{version}: content does not match the hash it was submitted with")
    if not version.preview or version.preview.get("content_hash") != version.content_hash:
        raise ActionError(f"{version} has no dry-run preview of its own content")
    with on_validating_target(spec):
        introspect.validate(spec)  # the table may have changed since submission
    floors.check_version(spec)  # a floor may have been set since submission

    previous = version.policy.versions.filter(state=State.APPROVED).first()
    if previous is not None:
        previous.state = State.SUPERSEDED
        previous.save(update_fields=["state"])
    now = timezone.now()
    version.state = State.APPROVED
    version.approved_hash = version.content_hash
    version.decided_by = actor
    version.decided_at = now
    version.decision_reason = reason
    version.save(
        update_fields=["state", "approved_hash", "decided_by", "decided_at", "decision_reason"]
    )
    decisions.sign_decision_on(version, actor)
    policy = version.policy
    policy.name = spec.name
    policy.schedule = spec.schedule
    policy.timezone = spec.timezone
    if spec.owner:
        policy.owner = spec.owner
    policy.save(update_fields=["name", "schedule", "timezone", "owner"])
    record_action(
        actor,
        "version.approve",
        version,
        reason=version.decision_reason,
        number=version.number,
        content_hash=version.content_hash,
        preview_eligible=version.preview.get("eligible"),
        preview_cutoff=version.preview.get("cutoff"),
        superseded=previous.number if previous else None,
    )
    policy_decided.send(Policy, policy=policy, decision="approved", actor=actor, version=version)
    return version


@transaction.atomic
def reject_version(version: PolicyVersion, *, actor, reason: str) -> PolicyVersion:
    """submitted → rejected, with a reason; never by anyone who wrote or submitted it."""
    check_role(actor, COMPLIANCE)
    check_approver(actor)
    reason = require_reason(reason, "rejecting a version")
    version = _locked_version(version)
    if version.state != State.SUBMITTED:
        raise ActionError(f"{version} is {version.state}, only a submitted version can be rejected")
    _check_four_eyes(version, actor, "decide on")
    _check_submission(version)
    version.state = State.REJECTED
    version.decided_by = actor
    version.decided_at = timezone.now()
    version.decision_reason = reason
    version.save(update_fields=["state", "decided_by", "decided_at", "decision_reason"])
    decisions.sign_decision_on(version, actor)
    record_action(actor, "version.reject", version, reason=reason, number=version.number)
    return version


@transaction.atomic
def place_hold(
    *,
    actor,
    reason: str,
    policy: Policy | None = None,
    tenant: str | list[str] | None = None,
    key_from: int | None = None,
    key_to: int | None = None,
) -> LegalHold:
    """Place a legal hold: rows in scope are not deleted by any chunk that commits after
    this commits. ``None`` scopes mean all policies / all tenants / unbounded keys; a list of
    values names each part of a tenant of several columns, in the policy's order.

    The tenant is checked against the tenant column types of every policy the hold applies
    to and stored in its canonical form (``retention.holds.check_placement``); the hold's
    ``coverage`` (what it protects, policy by policy, and how many rows now — with a warning
    and the values that match it ignoring case when that is none) is attached to the
    returned hold and recorded in the operator log. The policies are locked first (against
    a version being approved meanwhile with a type the value does not fit), then the hold
    fence is taken exclusive before inserting, so it waits for every chunk transaction
    already past its fence (they hold it shared) to commit."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "placing a legal hold")
    # The tenant is taken as written (the tenant column's type decides what it equals: an
    # integer ignores surrounding spaces, a text column does not); empty means all tenants.
    if isinstance(tenant, list | tuple):
        tenant = list(tenant)
        while tenant and tenant[-1] == "":
            tenant.pop()
        tenant = tenant[0] if len(tenant) == 1 else (tenant or None)
    if tenant == "":
        tenant = None
    limit = LegalHold._meta.get_field("tenant").max_length
    for part in [tenant] if isinstance(tenant, str) else tenant or []:
        if not isinstance(part, str) or part == "":
            raise ActionError("each part of a tenant of several columns needs a value")
        if len(part) > limit:
            raise ActionError(f"tenant must be at most {limit} characters, got {len(part)}")
        if "\x00" in part:
            raise ActionError("tenant contains a NUL character")
    if key_from is not None and key_to is not None and key_from >= key_to:
        raise ActionError(f"key interval [{key_from}, {key_to}) is empty")
    locked = Policy.objects.select_for_update().order_by("pk")
    list(locked.filter(pk=policy.pk) if policy is not None else locked)
    try:
        tenant, coverage = holds.check_placement(policy, tenant, key_from, key_to)
    except holds.TenantMismatch as exc:
        raise ActionError(str(exc)) from None
    if tenant is not None and len(tenant) > limit:
        raise ActionError(f"tenant must be at most {limit} characters, got {len(tenant)}")
    hold_fence(exclusive=True)
    hold = LegalHold.objects.create(
        policy=policy,
        tenant=tenant,
        key_from=key_from,
        key_to=key_to,
        reason=reason,
        placed_by=actor.username,
    )
    record_action(
        actor,
        "hold.place",
        hold,
        reason=reason,
        policy=policy.slug if policy else None,
        tenant=tenant,
        key_from=key_from,
        key_to=key_to,
        coverage=[c.to_json() for c in coverage],
    )
    hold.coverage = coverage
    return hold


def _locked_hold(hold: LegalHold, expected: str | None) -> LegalHold:
    """The hold re-read under a row lock (one decision on it at a time), refused when a page
    rendered for an older state posted ``expected`` (``core.oplog.check_decision``)."""
    hold = (
        LegalHold.objects.select_for_update(of=("self",)).select_related("policy").get(pk=hold.pk)
    )
    try:
        check_decision(hold, expected, now_is=hold.describe())
    except StaleDecision as exc:
        raise StaleDecision(f"hold #{hold.pk} {exc}") from None
    if hold.released_at is not None:
        raise ActionError(f"hold #{hold.pk} was already released by {hold.released_by}")
    return hold


def _pending_request(hold: LegalHold) -> None:
    if hold.release_requested_at is None:
        raise ActionError(f"hold #{hold.pk} has no release request; request it first")


def _clear_request(hold: LegalHold) -> dict:
    """Clear a pending request (withdrawn or refused); what it was, for the operator log."""
    was = {
        "requested_by": hold.release_requested_by,
        "requested_at": hold.release_requested_at.isoformat(),
        "request_reason": hold.release_request_reason,
    }
    hold.release_requested_by, hold.release_requested_at, hold.release_request_reason = (
        "", None, "",
    )  # fmt: skip
    hold.save(
        update_fields=["release_requested_by", "release_requested_at", "release_request_reason"]
    )
    return was


@transaction.atomic
def request_hold_release(
    hold: LegalHold, *, actor, reason: str, expected: str | None = None
) -> LegalHold:
    """Ask for a hold's release. The hold stays in force: releasing removes a protection, so
    another member of compliance must approve (``approve_hold_release``). What the release
    would do (``holds.release_impact``) is recorded with the request and attached to the
    returned hold as ``impact``."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "requesting a hold's release")
    hold = _locked_hold(hold, expected)
    if hold.release_requested_at is not None:
        raise ActionError(
            f"hold #{hold.pk} already has a release request by {hold.release_requested_by}"
        )
    impact = holds.release_impact(hold)
    hold.release_requested_by = actor.username
    hold.release_requested_at = timezone.now()
    hold.release_request_reason = reason
    hold.save(
        update_fields=["release_requested_by", "release_requested_at", "release_request_reason"]
    )
    decisions.sign_request(hold, actor)
    record_action(
        actor, "hold.release_request", hold, reason=reason,
        impact=[i.to_json() for i in impact],
    )  # fmt: skip
    hold.impact = impact
    return hold


@transaction.atomic
def approve_hold_release(
    hold: LegalHold, *, actor, reason: str, expected: str | None = None
) -> LegalHold:
    """Release a hold whose release another member of compliance requested; its rows become
    eligible again for later chunks. Never by the requester (the database refuses it too:
    ``legalhold_release_four_eyes``)."""
    check_role(actor, COMPLIANCE)
    check_approver(actor)
    reason = require_reason(reason, "approving a hold's release")
    hold = _locked_hold(hold, expected)
    _pending_request(hold)
    if hold.release_requested_by == actor.username:
        raise NeedsAnotherPerson(
            f"{actor.username} requested the release of hold #{hold.pk} and cannot approve "
            "it; another member of compliance must"
        )
    refusal = decisions.release_refusal(hold)
    if refusal:  # the request was written or changed behind the product's back
        raise ActionError(refusal)
    impact = holds.release_impact(hold)
    hold.released_by = actor.username
    hold.released_at = timezone.now()
    hold.release_reason = reason
    hold.save(update_fields=["released_by", "released_at", "release_reason"])
    decisions.sign_release(hold, actor)
    record_action(
        actor, "hold.release", hold, reason=reason,
        requested_by=hold.release_requested_by,
        requested_at=hold.release_requested_at.isoformat(),
        request_reason=hold.release_request_reason,
        impact=[i.to_json() for i in impact],
    )  # fmt: skip
    hold.impact = impact
    return hold


@transaction.atomic
def withdraw_hold_release(
    hold: LegalHold, *, actor, reason: str, expected: str | None = None
) -> LegalHold:
    """The requester takes back a pending release request; the hold stays in force."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "withdrawing a release request")
    hold = _locked_hold(hold, expected)
    _pending_request(hold)
    if hold.release_requested_by != actor.username:
        raise ActionError(
            f"only {hold.release_requested_by}, who requested it, can withdraw the release "
            f"request of hold #{hold.pk}; another member of compliance refuses it instead"
        )
    was = _clear_request(hold)
    record_action(actor, "hold.release_withdraw", hold, reason=reason, **was)
    return hold


@transaction.atomic
def refuse_hold_release(
    hold: LegalHold, *, actor, reason: str, expected: str | None = None
) -> LegalHold:
    """Another member of compliance turns a pending release request down; the hold stays in
    force (a new request can be made later)."""
    check_role(actor, COMPLIANCE)
    check_approver(actor)
    reason = require_reason(reason, "refusing a release request")
    hold = _locked_hold(hold, expected)
    _pending_request(hold)
    if hold.release_requested_by == actor.username:
        raise NeedsAnotherPerson(
            f"{actor.username} requested the release of hold #{hold.pk} and cannot refuse "
            "it; withdraw it instead"
        )
    was = _clear_request(hold)
    record_action(actor, "hold.release_refuse", hold, reason=reason, **was)
    return hold


def _locked_policy(policy: Policy, expected: str | None) -> Policy:
    """The policy re-read under a row lock, refused when the caller decided on an older state
    (``expected``: an API call's ``If-Match``; ``core.oplog.check_decision``)."""
    policy = Policy.objects.select_for_update().get(pk=policy.pk)
    try:
        check_decision(policy, expected, now_is=policy.describe())
    except StaleDecision as exc:
        raise StaleDecision(f"policy {policy.slug} {exc}") from None
    return policy


@transaction.atomic
def pause_policy(
    policy: Policy, *, actor, reason: str, alert: bool = False, expected: str | None = None
) -> Policy:
    """Stop new chunks of this policy from being admitted until resumed. A person needs the
    on-call role; the guard pauses in its own name (``actor="guard"``, ``alert=True``: its
    operator-log row is an alert)."""
    check_role_or_system(actor, ONCALL)
    reason = require_reason(reason, "pausing a policy")
    decision_fence(policy.pk)  # chunks in flight commit first; none starts after the pause
    policy = _locked_policy(policy, expected)
    if policy.paused:
        raise ActionError(f"policy {policy.slug} is already paused")
    policy.paused = True
    policy.paused_reason = reason
    policy.save(update_fields=["paused", "paused_reason"])
    record_action(
        actor, "policy.pause", policy, reason=reason, **({"alert": True} if alert else {})
    )
    policy_decided.send(Policy, policy=policy, decision="paused", actor=actor)
    return policy


@transaction.atomic
def resume_policy(policy: Policy, *, actor, reason: str, expected: str | None = None) -> Policy:
    """Undo ``pause_policy``."""
    check_role(actor, ONCALL)
    reason = require_reason(reason, "resuming a policy")
    policy = _locked_policy(policy, expected)
    if not policy.paused:
        raise ActionError(f"policy {policy.slug} is not paused")
    policy.paused = False
    policy.paused_reason = ""
    policy.save(update_fields=["paused", "paused_reason"])
    record_action(actor, "policy.resume", policy, reason=reason)
    policy_decided.send(Policy, policy=policy, decision="resumed", actor=actor)
    return policy


@transaction.atomic
def set_policy_enabled(
    policy: Policy, enabled: bool, *, actor, reason: str, expected: str | None = None
) -> Policy:
    """Enable or disable a policy: disabled, its schedule is removed and no run is triggered
    (open runs stop at their next chunk); enabled, its schedule is armed for the next tick."""
    check_role(actor, ONCALL)
    reason = require_reason(reason, "enabling a policy" if enabled else "disabling a policy")
    decision_fence(policy.pk)  # chunks in flight commit first; none starts after a disable
    policy = _locked_policy(policy, expected)
    if policy.enabled == enabled:
        raise ActionError(f"policy {policy.slug} is already {'enabled' if enabled else 'disabled'}")
    policy.enabled = enabled
    policy.save(update_fields=["enabled"])
    record_action(actor, "policy.enable" if enabled else "policy.disable", policy, reason=reason)
    policy_decided.send(
        Policy, policy=policy, decision="enabled" if enabled else "disabled", actor=actor
    )
    return policy


# -- retention floors --------------------------------------------------------------------------


def _floor_table(text: str) -> tuple[str, str]:
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) != 2 or not all(parts):
        raise SpecError(f'a floor names its table as "schema.table", got {text!r}')
    schema, table = parts
    introspect.table_oid(schema, table)  # an existing table (SpecError otherwise)
    return schema, table


@transaction.atomic
def request_floor(table: str, period: str, *, mode: str, actor, reason: str) -> RetentionFloor:
    """Ask for a floor on ``table`` ("schema.table"): in force once another member of
    compliance approves (``approve_floor``). Raising the floor in force is always possible;
    a compliance floor is never lowered nor weakened to governance; a governance floor is
    lowered only by a superuser's request (and then after a wait, ``floors.lowering_wait``)."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "setting a floor")
    if mode not in RetentionFloor.Mode.values:
        raise ActionError(f"a floor's mode is compliance or governance, got {mode!r}")
    period = check_period(period, "floor", expiry=False)
    if period == "forever":
        raise ActionError('a floor is a period such as "6 years", not "forever"')
    schema, name = _floor_table(table)
    pending = RetentionFloor.objects.filter(
        schema=schema, table=name, approved_at__isnull=True, refused_at__isnull=True
    ).first()
    if pending is not None:
        raise ActionError(
            f"floor #{pending.pk} on {schema}.{name} is waiting for approval; approve or "
            "refuse it first"
        )
    replaces, lowers = floors.check_request(
        schema, name, period, mode, superuser=bool(getattr(actor, "is_superuser", False))
    )
    floor = RetentionFloor.objects.create(
        schema=schema, table=name, period=period, mode=mode, requested_by=actor.username,
        request_reason=reason, replaces=replaces, lowers=lowers,
    )  # fmt: skip
    record_action(
        actor, "floor.request", floor, reason=reason, table=floor.qualified_table,
        period=period, mode=mode, lowers=lowers, replaces=replaces.pk if replaces else None,
    )  # fmt: skip
    return floor


@transaction.atomic
def approve_floor(floor: RetentionFloor, *, actor, reason: str, now=None) -> RetentionFloor:
    """Put a requested floor in force; never by its requester (the database refuses that
    too: ``retentionfloor_four_eyes``). A lowering takes effect ``floors.lowering_wait()``
    after this approval; anything else at once."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "approving a floor")
    floor = RetentionFloor.objects.select_for_update().get(pk=floor.pk)
    if not floor.pending:
        raise ActionError(f"{floor} is not waiting for approval")
    if floor.requested_by == actor.username:
        raise NeedsAnotherPerson(
            f"{actor.username} requested {floor} and cannot approve it; another member of "
            "compliance must"
        )
    # what is in force may have changed since the request: checked again (a superuser's
    # request was checked as one when made)
    replaces, lowers = floors.check_request(
        floor.schema, floor.table, floor.period, floor.mode, superuser=True
    )
    if lowers and not floor.lowers:
        raise ActionError(
            f"{floor} would now lower {replaces}; it was requested as a raise — request it again"
        )
    now = now or timezone.now()
    floor.approved_by = actor.username
    floor.approved_at = now
    floor.approve_reason = reason
    floor.effective_at = now + floors.lowering_wait() if lowers else now
    floor.save(update_fields=["approved_by", "approved_at", "approve_reason", "effective_at"])
    record_action(
        actor, "floor.approve", floor, reason=reason, table=floor.qualified_table,
        period=floor.period, mode=floor.mode, requested_by=floor.requested_by,
        effective_at=floor.effective_at.isoformat(), lowers=lowers,
    )  # fmt: skip
    return floor


@transaction.atomic
def refuse_floor(floor: RetentionFloor, *, actor, reason: str) -> RetentionFloor:
    """Refuse a requested floor (its requester may withdraw it the same way)."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "refusing a floor")
    floor = RetentionFloor.objects.select_for_update().get(pk=floor.pk)
    if not floor.pending:
        raise ActionError(f"{floor} is not waiting for approval")
    floor.refused_by = actor.username
    floor.refused_at = timezone.now()
    floor.refuse_reason = reason
    floor.save(update_fields=["refused_by", "refused_at", "refuse_reason"])
    record_action(actor, "floor.refuse", floor, reason=reason, table=floor.qualified_table)
    return floor
