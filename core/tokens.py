"""Creating, revoking and checking personal API tokens (``core.models.ApiToken``).

Each change writes its operator-log row in the same transaction. A token carries its
owner's roles at the moment of use: revoking a role takes effect on the next command.
"""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from core.models import ApiToken
from core.roles import ALL_ROLES, check_role
from core.seals import is_sealed, read_once

MAX_ACTIVE = 20  # per person


class TokenError(ValueError):
    """The token is unknown, revoked or its owner inactive; the message is one line."""


def _record(actor, action: str, token: ApiToken, **details) -> None:
    from core.oplog import record_action  # the operator log lives with the policies

    record_action(actor, action, token, name=token.name, prefix=token.prefix, **details)


@transaction.atomic
def create_token(user, *, name: str, via: str = "web") -> tuple[ApiToken, str]:
    """A new token for ``user`` (who must hold a role); returns it and its secret, which
    is never stored and cannot be shown again."""
    check_role(user, *ALL_ROLES)
    name = (name or "").strip()
    if not name or len(name) > 100 or any(ord(c) < 32 for c in name):
        raise TokenError("a token needs a name of 1 to 100 printable characters")
    if ApiToken.objects.filter(user=user, revoked_at=None).count() >= MAX_ACTIVE:
        raise TokenError(f"{user.username} already has {MAX_ACTIVE} active tokens; revoke one")
    secret = ApiToken.PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=secret[:12], digest=ApiToken.digest_of(secret)
    )
    _record(user, "token.create", token, via=via)
    return token, secret


@transaction.atomic
def revoke_token(token: ApiToken, *, actor) -> ApiToken:
    """Revoke one of ``actor``'s own tokens (a superuser may revoke anyone's)."""
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.user_id != actor.pk and not actor.is_superuser:
        raise TokenError("only its owner revokes a token")
    if token.revoked_at is not None:
        raise TokenError(f"token {token.prefix}… is already revoked")
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    _record(actor, "token.revoke", token, owner=token.user.username)
    return token


def user_for_token(secret: str) -> tuple[object, ApiToken]:
    """The active user a token belongs to, and the token; ``TokenError`` otherwise.
    The lookup is by digest (a unique index), so timing reveals nothing of the secret."""
    token = (
        ApiToken.objects.select_related("user", "user__seal")
        .filter(digest__in=ApiToken.digests_of(secret.strip()))
        .first()
    )
    if token is None:
        raise TokenError("RETENTION_TOKEN is not a known token")
    if token.revoked_at is not None:
        raise TokenError(f"token {token.prefix}… was revoked on {token.revoked_at:%Y-%m-%d %H:%M}")
    if not token.user.is_active:
        raise TokenError(f"the owner of token {token.prefix}… is inactive")
    if not is_sealed(token.user, read_once(token.user)):
        raise TokenError(
            f"the account of token {token.prefix}…'s owner was changed outside the product "
            "(its seal does not match; `retention audit verify` names it)"
        )
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user, token
