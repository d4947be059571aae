"""Users and role memberships without the demo: add a user, grant and revoke a role.

Roles are the four groups ``migrate`` creates (core/migrations). Only a superuser creates
people and changes roles — never their own — so no compliance officer can make a second
account and pass four-eyes alone (docs/security.md). Every change writes its operator-log row
(who, what, to whom, why) in the same transaction, and reseals the account (core.seals)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from core.oplog import record_action
from core.roles import ALL_ROLES
from core.seals import is_sealed

GRANT, REVOKE = "role.grant", "role.revoke"


def check_manager(actor, *, subject=None) -> None:
    """Refuse unless ``actor`` may manage users and roles — a superuser whose account is
    sealed — and ``subject`` is not themself."""
    if not (getattr(actor, "is_superuser", False) and is_sealed(actor)):
        raise PermissionDenied(
            f"{getattr(actor, 'username', actor)} may not manage people or roles: "
            "that takes a superuser (a compliance officer cannot create or empower accounts)"
        )
    if subject is not None and subject.pk == actor.pk:
        raise PermissionDenied("nobody changes their own roles: ask another superuser")


def _role(name: str) -> Group:
    if name not in ALL_ROLES:
        raise ValueError(f"unknown role {name!r}: one of {', '.join(ALL_ROLES)}")
    group = Group.objects.filter(name=name).first()
    if group is None:
        raise ValueError(f"role group {name!r} is missing: run `manage.py migrate`")
    return group


@transaction.atomic
def grant_role(user, role: str, *, actor, reason: str = "", via: str = "cli") -> bool:
    """Give ``user`` the role; False (and no log row) if they already hold it."""
    group = _role(role)
    check_manager(actor, subject=user)
    if user.groups.filter(pk=group.pk).exists():
        return False
    user.groups.add(group)
    record_action(
        actor, GRANT, user, reason=reason.strip(), role=role, username=user.username, via=via
    )
    return True


@transaction.atomic
def revoke_role(user, role: str, *, actor, reason: str = "", via: str = "cli") -> bool:
    """Take the role from ``user``; False (and no log row) if they do not hold it."""
    group = _role(role)
    check_manager(actor, subject=user)
    if not user.groups.filter(pk=group.pk).exists():
        return False
    user.groups.remove(group)
    record_action(
        actor, REVOKE, user, reason=reason.strip(), role=role, username=user.username, via=via
    )
    return True


@transaction.atomic
def add_user(username: str, password: str, *, actor, email: str = "", via: str = "cli"):
    """Create a user (no role yet) with a password that passes the password validators."""
    check_manager(actor)
    User = get_user_model()
    username = username.strip()
    if not username:
        raise ValueError("a username is required")
    if User.objects.filter(username=username).exists():
        raise ValueError(f"user {username!r} already exists")
    candidate = User(username=username, email=email)
    try:
        validate_password(password, candidate)
    except ValidationError as exc:
        raise ValueError("password refused: " + " ".join(exc.messages)) from None
    user = User.objects.create_user(username=username, email=email, password=password)
    record_action(actor, "user.create", user, username=username, via=via)
    return user


def memberships() -> dict[str, list[str]]:
    """Role → usernames holding it through its group (superusers hold every role besides)."""
    out: dict[str, list[str]] = {role: [] for role in ALL_ROLES}
    for group in Group.objects.filter(name__in=ALL_ROLES).prefetch_related("user_set"):
        out[group.name] = sorted(u.username for u in group.user_set.all() if u.is_active)
    return out


def superusers() -> list[str]:
    User = get_user_model()
    return sorted(
        User.objects.filter(is_superuser=True, is_active=True).values_list("username", flat=True)
    )
