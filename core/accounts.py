"""Users and role memberships without the demo: add a user, grant and revoke a role.

Roles are the four groups ``migrate`` creates (core/migrations). Only a superuser creates
people and changes roles — never their own — so no compliance officer can make a second
account and pass four-eyes alone (docs/security.md). Every change writes its operator-log row
(who, what, to whom, why) in the same transaction, signed by the web process
(``core.oplog``), and reseals the account (core.seals).

A token or a session alone changes no one: the acting superuser's password must have been
given again for this very request or command (``password_confirmed``, set by the API, the
CLI and the admin after they checked it). And granting *compliance* makes an approver only
once a second superuser confirms it (``grant_role`` again, by another superuser), or — when
``COMPLIANCE_COOLING_OFF_S`` is set — after that long; until then the new officer may write
and submit versions but not approve, reject or release (``approver_refusal``)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone

from core.models import OperatorAction
from core.oplog import ACTION_FIELDS, ActionError, action_hash, record_action
from core.roles import ALL_ROLES, COMPLIANCE
from core.seals import is_sealed
from signatures import proof

GRANT, REVOKE, CONFIRM = "role.grant", "role.revoke", "role.confirm"

_confirmed: ContextVar[int | None] = ContextVar("retention_password_confirmed", default=None)


@contextmanager
def password_confirmed(user):
    """Within this block ``user`` gave their password again (the entry point checked it)."""
    token = _confirmed.set(user.pk)
    try:
        yield
    finally:
        _confirmed.reset(token)


def is_password_confirmed(user) -> bool:
    return _confirmed.get() == getattr(user, "pk", None)


def _require_password(actor, doing: str) -> None:
    if _confirmed.get() != getattr(actor, "pk", None):
        raise PermissionDenied(
            f"{doing} needs {getattr(actor, 'username', actor)}'s password again: a token or "
            "a session alone changes no one"
        )


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
    _require_password(actor, f"granting {role}")
    if user.groups.filter(pk=group.pk).exists():
        pending = _pending_grant(user) if role == COMPLIANCE else None
        if pending is None:
            return False
        if pending.actor == actor.username:
            raise ActionError(
                f"{actor.username} granted {user.username} compliance and cannot confirm it; "
                "another superuser must"
            )
        record_action(
            actor, CONFIRM, user, reason=reason.strip(), role=role, username=user.username,
            granted_by=pending.actor, grant=pending.chain_seq, via=via,
        )  # fmt: skip
        return True
    user.groups.add(group)
    record_action(
        actor, GRANT, user, reason=reason.strip(), role=role, username=user.username, via=via,
        **({"awaiting_confirmation": True} if role == COMPLIANCE else {}),
    )  # fmt: skip
    return True


@transaction.atomic
def revoke_role(user, role: str, *, actor, reason: str = "", via: str = "cli") -> bool:
    """Take the role from ``user``; False (and no log row) if they do not hold it."""
    group = _role(role)
    check_manager(actor, subject=user)
    _require_password(actor, f"revoking {role}")
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
    _require_password(actor, "creating a person")
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


def _verified(row) -> bool:
    """The operator-log row is as the web process signed it: its hash recomputed from its
    content, and that hash signed for a person."""
    fields = {name: getattr(row, name) for name in ACTION_FIELDS}
    if action_hash({**fields, "details_text": row.details_text}, row.prev_hash) != row.hash:
        return False
    body, _ = proof.check(
        "oplog", f"operatoraction:{row.chain_seq}", {"hash": row.hash, "actor": row.actor}
    )
    return body is not None


def _pending_grant(user):
    """The operator-log row of ``user``'s compliance grant that awaits a second superuser,
    or None: the newest signed grant, confirmation or revocation of it decides (rows that do
    not verify are not decisions)."""
    rows = (
        OperatorAction.objects.filter(
            target_type=user._meta.model_name,
            target_id=str(user.pk),
            action__in=(GRANT, CONFIRM, REVOKE),
            details__role=COMPLIANCE,
        )
        .annotate(details_text=Cast("details", TextField()))
        .order_by("-chain_seq")
    )
    for row in rows:
        if not _verified(row):
            continue
        if row.action == GRANT and row.details.get("awaiting_confirmation"):
            return row
        return None
    return None


def approver_refusal(user) -> str:
    """ "" when ``user`` may approve, reject or release as compliance; else why not: their
    compliance grant awaits a second superuser (and, with ``COMPLIANCE_COOLING_OFF_S``, its
    cooling-off has not passed)."""
    pending = _pending_grant(user)
    if pending is None:
        return ""
    cooling = getattr(settings, "COMPLIANCE_COOLING_OFF_S", 0)
    if cooling and timezone.now() >= pending.at + timedelta(seconds=cooling):
        return ""
    until = (
        f" or until {(pending.at + timedelta(seconds=cooling)).isoformat(timespec='minutes')}"
        if cooling
        else ""
    )
    return (
        f"{user.username}'s compliance role, granted by {pending.actor}, awaits a second "
        f"superuser's confirmation{until}: until then they cannot approve, reject or release"
    )


def check_approver(user) -> None:
    """``ActionError`` when ``user`` may not decide as compliance yet (``approver_refusal``)."""
    refusal = approver_refusal(user)
    if refusal:
        raise ActionError(refusal)


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
