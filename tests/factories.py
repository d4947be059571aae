"""Build policies the way production does: a draft, submitted by one person, approved by another."""

from __future__ import annotations

from django.contrib.auth.models import User

from retention import actions
from retention.models import Policy, PolicyVersion
from retention.spec import PolicySpec


def events_spec(slug: str = "events", table: str = "rr_events", **overrides) -> dict:
    """The policy most tests use on ``tests.runs.conftest.create_events`` tables: rows older
    than 20 days, 'disputed' kept, per tenant, chunks of 200."""
    spec = dict(
        slug=slug,
        name=f"{slug.capitalize()} older than 20 days",
        table=f"public.{table}",
        key="id",
        timestamp="occurred_at",
        tenant="tenant_id",
        retention="20 days",
        schedule="0 3 * * *",
        timezone="UTC",
        chunk_size=200,
        keep=[{"column": "status", "op": "=", "value": "disputed"}],
        limits={"policy_workers": 2, "tenant_workers": 1},
        # per-tenant chunks: these tests are about tenant ceilings and per-tenant order; the
        # table interleaves tenants, where "auto" would chunk by key range across them
        chunking="tenant",
    )
    spec.update(overrides)
    return spec


def approved_policy(make_user, **spec_fields) -> Policy:
    spec = PolicySpec.parse(spec_fields)
    author = _user(make_user, "author-" + spec.slug, "compliance")
    approver = _user(make_user, "approver-" + spec.slug, "compliance")
    version = actions.apply_spec(spec, author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    actions.approve_version(version, actor=approver, reason="approved for the test")
    return Policy.objects.get(slug=spec.slug)


def backdate_approval(policy: Policy, when, *, created_too: bool = False) -> None:
    """Move a policy's approval back to ``when`` as if it had been made then: the row's time
    and its signature, which the web process would have made at that time (a row's time
    changed alone no longer verifies, and nothing would run)."""
    from retention import decisions

    versions = PolicyVersion.objects.filter(policy=policy)
    versions.update(decided_at=when, **({"created_at": when} if created_too else {}))
    for version in versions.filter(state=PolicyVersion.State.APPROVED):
        decisions.sign_decision_on(version, version.decided_by)
    decisions.forget()


def release_hold(hold, *, requester, approver, reason: str = "released") -> None:
    """Release a legal hold the way production does: one compliance officer requests, another
    approves."""
    actions.request_hold_release(hold, actor=requester, reason=reason)
    actions.approve_hold_release(hold, actor=approver, reason=reason)


def _user(make_user, username, role) -> User:
    return User.objects.filter(username=username).first() or make_user(username, role)
