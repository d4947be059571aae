"""Build policies the way production does: a draft, submitted by one person, approved by another."""

from __future__ import annotations

from django.contrib.auth.models import User

from retention import actions
from retention.models import Policy, PolicyVersion
from retention.spec import PolicySpec


def approved_policy(make_user, **spec_fields) -> Policy:
    spec = PolicySpec.parse(spec_fields)
    author = _user(make_user, "author-" + spec.slug, "compliance")
    approver = _user(make_user, "approver-" + spec.slug, "compliance")
    version = actions.apply_spec(spec, author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author)
    actions.approve_version(version, actor=approver, reason="approved for the test")
    return Policy.objects.get(slug=spec.slug)


def _user(make_user, username, role) -> User:
    return User.objects.filter(username=username).first() or make_user(username, role)
