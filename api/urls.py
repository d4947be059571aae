"""``/api/v1/`` for ``config/urls.py``. Each request runs in a context of its own, so the
identity its token establishes (``core.cli_identity.act_for_request``) ends with it; the
API's own authentication replaces the pages' sign-in (``login_not_required``)."""

from __future__ import annotations

import contextvars
from functools import wraps

from django.contrib.auth.decorators import login_not_required

from .main import api


def _own_context(view):
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        return contextvars.copy_context().run(view, request, *args, **kwargs)

    return login_not_required(wrapped)


patterns, app_name, namespace = api.urls
for pattern in patterns:
    pattern.callback = _own_context(pattern.callback)
urls = (patterns, app_name, namespace)
