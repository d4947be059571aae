"""``/api/v1/`` for ``config/urls.py``. Each request runs in a context of its own, so the
identity its token establishes (``core.cli_identity.act_for_request``) ends with it; the
API's own authentication replaces the pages' sign-in (``login_not_required``). Malformed input
(``api.inputs``) is refused before any endpoint reads it."""

from __future__ import annotations

import contextvars
from functools import wraps

from django.contrib.auth.decorators import login_not_required
from django.http import JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from .inputs import problem
from .main import api


def _own_context(view):
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        malformed = problem(request)
        if malformed is not None:
            return JsonResponse({"code": "invalid_request", "message": malformed}, status=422)
        response = contextvars.copy_context().run(view, request, *args, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(
            "application/json"
        ):
            allowed = response.get("Allow", "")
            return JsonResponse(
                {"code": "method_not_allowed", "message": f"{request.method} is not served here "
                 f"(allowed: {allowed})"}, status=405, headers={"Allow": allowed},
            )  # fmt: skip
        return response

    return login_not_required(wrapped)


@csrf_exempt  # as every endpoint of the API: no cookie decides anything here
def _no_such_endpoint(request, rest: str = ""):
    return JsonResponse(
        {"code": "not_found", "message": f"no endpoint {request.path} (docs/api.md)"}, status=404
    )


patterns, app_name, namespace = api.urls
# whatever else is under /api/v1/: the API's own 404, not the pages'
patterns = [*patterns, re_path(r"^(?P<rest>[\s\S]*)$", _no_such_endpoint, name="no-such-endpoint")]
for pattern in patterns:
    pattern.callback = _own_context(pattern.callback)
urls = (patterns, app_name, namespace)
