"""The API's errors: one JSON shape, ``{"code": ..., "message": ...}``, with a stable code per
kind of refusal (docs/api.md lists them). A command that wrote output before it failed (``audit
verify`` lists the problems it found) returns that output too."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError
from django.http import Http404
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from core.oplog import ActionError, NeedsAnotherPerson, StaleDecision
from core.tokens import TokenError


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", what)


# exception class -> (HTTP status, code); the first match in this order wins
MAPPING: tuple[tuple[type[Exception], int, str], ...] = (
    (StaleDecision, 412, "stale_state"),
    (NeedsAnotherPerson, 403, "four_eyes"),
    (PermissionDenied, 403, "forbidden"),
    (ActionError, 409, "refused"),
    (TokenError, 409, "refused"),
    (CommandError, 400, "invalid"),
    (ValueError, 400, "invalid"),  # SpecError and other bad input
)


def classify(exc: Exception) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
    for kind, status, code in MAPPING:
        if isinstance(exc, kind):
            message = str(exc) or code.replace("_", " ")
            if kind is StaleDecision:  # an API caller sent If-Match; no page was loaded
                message = message.replace(
                    "changed since the page was loaded", "changed since the ETag sent as If-Match"
                ).replace("reload and decide again", "GET it again (a new ETag) and decide again")
            return ApiError(status, code, message)
    return None


def install(api) -> None:
    """Every error the API answers with has the one shape."""

    def respond(request, error: ApiError):
        return api.create_response(
            request, {"code": error.code, "message": error.message, **error.extra},
            status=error.status,
        )  # fmt: skip

    def on_validation(request, exc: ValidationError):
        first = exc.errors[0] if exc.errors else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request"
        return respond(request, ApiError(422, "invalid_request", message))

    def on_authentication(request, exc):
        return respond(
            request,
            ApiError(
                401, "unauthenticated", "send a personal API token: Authorization: Bearer rrt_..."
            ),
        )

    def on_throttled(request, exc: Throttled):
        return respond(request, ApiError(429, "throttled", "too many requests; retry later"))

    def on_http(request, exc: HttpError):
        return respond(request, ApiError(exc.status_code, "http_error", str(exc)))

    def on_404(request, exc):
        return respond(request, ApiError(404, "not_found", str(exc) or "not found"))

    def on_known(request, exc: Exception):
        error = classify(exc)
        if error is None:
            raise exc
        return respond(request, error)

    api.add_exception_handler(ValidationError, on_validation)
    api.add_exception_handler(AuthenticationError, on_authentication)
    api.add_exception_handler(Throttled, on_throttled)
    api.add_exception_handler(HttpError, on_http)
    api.add_exception_handler(Http404, on_404)
    for kind in (ApiError, *(kind for kind, _, _ in MAPPING)):
        api.add_exception_handler(kind, on_known)
