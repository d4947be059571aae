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
