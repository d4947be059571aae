"""The signed decisions of policies and holds: what each signature covers, and whether a
version's approval and a hold's release verify (``signatures``, ``core.oplog.sign_decision``).

One home for each decision's content: the action that makes the decision signs
``*_content`` of the row it just wrote, and every check — the workers before a chunk, the
scheduler before a run, the partition path, the DELETE's hold test, ``retention audit
verify`` — compares the same content of the row as it is now with what was signed. A row
written or changed with a database login alone has no signature that matches it: an
approval that does not verify runs nothing, a release that does not verify leaves its hold in
force, and ``audit verify`` names both."""

from __future__ import annotations

import time

from django.db import transaction

from core.oplog import sign_decision, subject_of
from retention.models import LegalHold, PolicyVersion
from retention.spec import PolicySpec
from signatures import proof
from signatures.models import Signature

State = PolicyVersion.State

SUBMIT, APPROVE, REJECT = "version.submit", "version.approve", "version.reject"
REQUEST, RELEASE = "hold.release_request", "hold.release"


def submit_content(version: PolicyVersion) -> dict:
    return {
        "policy_id": version.policy_id,
        "number": version.number,
        "content_hash": version.content_hash,
        "author_id": version.author_id,
        "submitted_by_id": version.submitted_by_id,
        "submitted_at": version.submitted_at,
    }


def decision_content(version: PolicyVersion) -> dict:
    """An approval's or a rejection's content: the version, its authors and the decision."""
    return {
        **submit_content(version),
        "approved_hash": version.approved_hash,
        "decided_by_id": version.decided_by_id,
        "decided_at": version.decided_at,
        "decision_reason": version.decision_reason,
    }


def _hold_scope(hold: LegalHold) -> dict:
    return {
        "policy_id": hold.policy_id,
        "tenant": hold.tenant,
        "key_from": hold.key_from,
        "key_to": hold.key_to,
    }


def request_content(hold: LegalHold) -> dict:
    return {
        **_hold_scope(hold),
        "requested_by": hold.release_requested_by,
        "requested_at": hold.release_requested_at,
        "request_reason": hold.release_request_reason,
    }


def release_content(hold: LegalHold) -> dict:
    return {
        **request_content(hold),
        "released_by": hold.released_by,
        "released_at": hold.released_at,
        "release_reason": hold.release_reason,
    }


def sign_submission(version: PolicyVersion, actor) -> None:
    sign_decision(actor, SUBMIT, version, **submit_content(version))


def sign_decision_on(version: PolicyVersion, actor) -> None:
    kind = APPROVE if version.state == State.APPROVED else REJECT
    sign_decision(actor, kind, version, **decision_content(version))


def sign_request(hold: LegalHold, actor) -> None:
    sign_decision(actor, REQUEST, hold, **request_content(hold))


def sign_release(hold: LegalHold, actor) -> None:
    sign_decision(actor, RELEASE, hold, **release_content(hold))
    forget()  # this process reads the releases again, now and after the commit
    transaction.on_commit(forget)


def _signed_by(body: dict | None, user_id=None, username: str | None = None) -> bool:
    by = (body or {}).get("by") or {}
    if user_id is not None and by.get("id") != user_id:
        return False
    return username is None or by.get("username") == username


def _candidates(subjects: list[str]) -> dict[str, list[Signature]]:
    found: dict[str, list[Signature]] = {}
    for signature in Signature.objects.filter(subject__in=subjects).order_by("-pk"):
        found.setdefault(signature.subject, []).append(signature)
    return found


def submission_refusal(version: PolicyVersion, signatures=None) -> str:
    """ "" when the version's submission verifies: signed by its submitter, over its content
    hash and author as they are now; else why not."""
    body, reason = proof.check(SUBMIT, subject_of(version), submit_content(version), signatures)
    if body is None:
        return f"the submission of {version} does not verify: {reason}"
    if not _signed_by(body, version.submitted_by_id):
        return f"the submission of {version} was not signed by its submitter"
    return ""


def decision_refusal(version: PolicyVersion, signatures=None) -> str:
    """ "" when the version's approval (or rejection) verifies — signed by the person the row
    names, who neither wrote nor submitted it, over the content as it is now, and its
    submission verifies too; else why not, one line."""
    if signatures is None:
        signatures = _candidates([subject_of(version)]).get(subject_of(version), [])
    kind = REJECT if version.state == State.REJECTED else APPROVE
    body, reason = proof.check(kind, subject_of(version), decision_content(version), signatures)
    if body is None:
        noun = "rejection" if kind == REJECT else "approval"
        return f"the {noun} of {version} does not verify: {reason}"
    if not _signed_by(body, version.decided_by_id):
        return f"the decision on {version} was not signed by the person it names"
    if version.decided_by_id in (version.author_id, version.submitted_by_id):
        return f"the decision on {version} was signed by someone who had a hand in it"
    return submission_refusal(version, signatures)


_APPROVED: dict[tuple, bool] = {}  # the approvals this process saw verify, by content
RELEASES_TTL_S = 10.0  # how long this process trusts its list of verified releases
_releases: tuple[float, list[int]] | None = None


def _approval_key(version: PolicyVersion) -> tuple:
    return (
        version.pk,
        version.state,
        proof.canonical(proof.plain(decision_content(version))),
        proof.canonical(proof.plain(version.spec)),
    )


def approval_refusal(version: PolicyVersion) -> str:
    """ "" when ``version`` (as read) is approved by a decision that verifies, no later version
    of its policy has an approval that verifies, and its specification is the content that was
    approved; else why not (one line). The workers before every chunk, the scheduler before a
    run and the partition path ask this. An approval seen to verify is remembered by its
    content, so a chunk pays no query for it."""
    key = _approval_key(version)
    if key in _APPROVED:
        return ""
    if version.state not in (State.APPROVED, State.SUPERSEDED) or not version.decided_at:
        return f"{version} is {version.state}, not approved"
    refusal = decision_refusal(version)
    if refusal:
        return refusal
    if PolicySpec.from_json(version.spec).content_hash() != version.approved_hash:
        return f"{version}: the stored specification is not the content that was approved"
    later = (
        PolicyVersion.objects.filter(
            policy_id=version.policy_id, number__gt=version.number, decided_at__isnull=False
        )
        .exclude(state=State.REJECTED)
        .select_related("policy")
    )
    for newer in later:
        if not decision_refusal(newer):
            return f"{version} was superseded by the approval of {newer}"
    if len(_APPROVED) > 1000:
        _APPROVED.clear()
    _APPROVED[key] = True
    return ""


def forget() -> None:
    """Drop what this process remembers (after a release, and between tests)."""
    global _releases
    _APPROVED.clear()
    _releases = None


def verified_release_ids() -> list[int]:
    """Ids of the released holds whose release verifies: the request signed by the person it
    names, the release by another person, both over the hold as it is now. Any other hold
    with a release date — written with a database login alone — stays in force. Read again
    after ``RELEASES_TTL_S`` (and at once after a release in this process): a list that is
    behind can only keep a hold in force a little longer, never release one."""
    global _releases
    now = time.monotonic()
    if _releases is not None and now - _releases[0] < RELEASES_TTL_S:
        return _releases[1]
    released = list(LegalHold.objects.filter(released_at__isnull=False).order_by("pk"))
    found = _candidates([subject_of(h) for h in released]) if released else {}
    ids = [h.pk for h in released if not release_refusal(h, found.get(subject_of(h), []))]
    _releases = (now, ids)
    return ids


def release_refusal(hold: LegalHold, signatures=None) -> str:
    subject = subject_of(hold)
    body, reason = proof.check(REQUEST, subject, request_content(hold), signatures)
    if body is None:
        return f"the release request of hold #{hold.pk} does not verify: {reason}"
    if not _signed_by(body, username=hold.release_requested_by):
        return f"the release request of hold #{hold.pk} was not signed by its requester"
    if hold.released_at is None:
        return ""
    body, reason = proof.check(RELEASE, subject, release_content(hold), signatures)
    if body is None:
        return f"the release of hold #{hold.pk} does not verify: {reason}"
    if not _signed_by(body, username=hold.released_by):
        return f"the release of hold #{hold.pk} was not signed by the person it names"
    if hold.released_by == hold.release_requested_by:
        return f"the release of hold #{hold.pk} was approved by its requester"
    return ""


def unverified_decisions() -> list[str]:
    """One line for every version decision and hold release (or request) whose signature is
    missing or does not verify: ``retention audit verify``'s list."""
    out = []
    versions = list(
        PolicyVersion.objects.select_related("policy")
        .exclude(submitted_at__isnull=True)
        .order_by("pk")
    )
    holds = list(LegalHold.objects.exclude(release_requested_at__isnull=True).order_by("pk"))
    found = _candidates([subject_of(v) for v in versions] + [subject_of(h) for h in holds])
    for version in versions:
        signatures = found.get(subject_of(version), [])
        if version.decided_at is not None:
            refusal = decision_refusal(version, signatures)
        else:
            refusal = submission_refusal(version, signatures)
        if refusal:
            out.append(refusal)
    for hold in holds:
        refusal = release_refusal(hold, found.get(subject_of(hold), []))
        if refusal:
            out.append(refusal)
    return out
