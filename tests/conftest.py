"""Shared fixtures. Every test runs on real PostgreSQL (embedded unless DATABASE_URL is set)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from core.roles import ALL_ROLES


@pytest.fixture
def make_user(db):
    """``make_user("alice", "compliance")`` — a user holding the given roles."""

    def make(username: str, *roles: str) -> User:
        user = User.objects.create_user(username=username, password=f"{username}-pw")
        for role in roles:
            assert role in ALL_ROLES, role
            group, _ = Group.objects.get_or_create(name=role)
            user.groups.add(group)
        return user

    return make


@pytest.fixture(autouse=True)
def no_cli_identity(monkeypatch):
    """No test inherits a CLI identity, and whatever one sets is undone after it."""
    monkeypatch.setenv("RETENTION_TOKEN", "")
    monkeypatch.delenv("RETENTION_TOKEN")


def token_for_claim(args) -> None:
    """Before a CLI call in a test: act as the user its ``--author``/``--approver``/``--by``
    names (a fresh personal token of theirs in ``RETENTION_TOKEN``), so the flag and the
    credential agree. No such user: no token, and the command is refused for that."""
    import os

    from core.models import ApiToken

    args = list(args)
    os.environ.pop("RETENTION_TOKEN", None)
    for flag in ("--author", "--approver", "--by"):
        if flag in args[:-1]:
            user = User.objects.filter(username=args[args.index(flag) + 1]).first()
            if user is not None:
                secret = f"{ApiToken.PREFIX}test-{user.pk}-{ApiToken.objects.count()}"
                ApiToken.objects.create(
                    user=user, name="tests", prefix=secret[:12], digest=ApiToken.digest_of(secret)
                )
                os.environ["RETENTION_TOKEN"] = secret
            return


@pytest.fixture
def act_as(monkeypatch):
    """``act_as(user)`` — CLI commands (in this process and in child processes started
    from it) act as ``user``: a personal API token of theirs in ``RETENTION_TOKEN``."""
    from core.tokens import create_token

    def use(user) -> str:
        _, secret = create_token(user, name="tests")
        monkeypatch.setenv("RETENTION_TOKEN", secret)
        return secret

    yield use
