"""Who calls: a personal API token (``Authorization: Bearer rrt_…``, ``core.tokens``), checked on
every request, and the roles an endpoint needs (``core.roles``, as the pages' ``require_role``).

The token's owner then acts in every action the request runs (``core.cli_identity.acting_as``),
so each operator-log row says ``via: api`` and which token. The actions check the roles again."""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from django.conf import settings
from django.contrib.auth import authenticate
from django.http import JsonResponse
from ninja.security import HttpBearer

from core.cli_identity import act_for_request
from core.models import ApiToken
from core.roles import ALL_ROLES, check_role, roles_of
from core.tokens import TokenError, user_for_token

from .errors import ApiError


@dataclass(frozen=True)
class Caller:
    user: object
    token: ApiToken

    def __str__(self) -> str:  # the throttle's key: one budget per token
        return f"token:{self.token.pk}"


class Token(HttpBearer):
    """A bearer token whose owner holds one of ``roles`` (any role when none are given)."""

    def __init__(self, *roles: str):
        super().__init__()
        self.roles = roles or ALL_ROLES

    def __call__(self, request):
        if not request.headers.get(self.header):
            raise ApiError(
                401, "unauthenticated", "send a personal API token: Authorization: Bearer rrt_..."
            )
        return super().__call__(request)

    def authenticate(self, request, token: str):
        try:
            user, api_token = user_for_token(token)
        except TokenError as exc:
            raise ApiError(
                401, "token_refused", str(exc).replace("RETENTION_TOKEN", "the token")
            ) from None
        check_role(user, *self.roles)  # PermissionDenied: 403 forbidden
        act_for_request(user, {"via": "api", "token": api_token.prefix})
        return Caller(user, api_token)


def caller(request) -> Caller:
    return request.auth


def password_again(request, password: str, doing: str) -> None:
    """Sudo over the API: the caller's password with the request (django-axes counts a wrong
    one), so a token taken from someone cannot do ``doing`` on its own; ``ApiError`` 403
    ``password_required`` otherwise."""
    user = caller(request).user
    if not password:
        raise ApiError(403, "password_required", f"send your password to confirm {doing}")
    again = authenticate(request, username=user.get_username(), password=password)
    if again is None or again.pk != user.pk:
        raise ApiError(403, "password_required", f"wrong password: {doing} was not done")


def schema_readers_only(view):
    """The schema and the browsable docs: for a token's owner or a signed-in person holding a
    role (the docs page fetches the schema with the session), or anyone when
    ``API_PUBLIC_SCHEMA`` is on. Anonymous: 401, the API's error shape."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        if settings.API_PUBLIC_SCHEMA or roles_of(getattr(request, "user", None)):
            return view(request, *args, **kwargs)
        header = request.headers.get("Authorization", "")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() == "bearer" and secret.strip():
            try:
                user, _token = user_for_token(secret)
            except TokenError as exc:
                message = str(exc).replace("RETENTION_TOKEN", "the token")
                return JsonResponse({"code": "token_refused", "message": message}, status=401)
            if roles_of(user):
                return view(request, *args, **kwargs)
            return JsonResponse(
                {"code": "forbidden", "message": "the token's owner holds no role"}, status=403
            )
        return JsonResponse(
            {
                "code": "unauthenticated",
                "message": "the API's schema needs a personal API token: "
                "Authorization: Bearer rrt_...",
            },
            status=401,
        )

    return guarded
