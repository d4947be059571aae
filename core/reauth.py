"""Sudo mode: the steps that hand out power or take a protection away — approving a policy
version, approving a legal hold's release and creating an API token — ask for the person's
password again unless they gave it in the last few minutes
(``REAUTH_WINDOW_S``, 5 by default). A session taken from someone (a cookie, a session key
read off a database connection) then cannot approve or mint a lasting credential on its own.
The password goes through ``authenticate()``, so django-axes counts wrong ones."""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.exceptions import PermissionDenied

SESSION_KEY = "retention_password_at"


def recently_confirmed(request) -> bool:
    at = request.session.get(SESSION_KEY)
    return at is not None and 0 <= time.time() - at < settings.REAUTH_WINDOW_S


def require_recent_password(request, doing: str) -> None:
    """Pass when the password was confirmed recently or the request carries the right one
    (then it counts as confirmed); else ``PermissionDenied`` with one line."""
    if recently_confirmed(request):
        return
    password = request.POST.get("password", "")
    if not password:
        raise PermissionDenied(f"enter your password to confirm {doing}")
    user = authenticate(request, username=request.user.get_username(), password=password)
    if user is None or user.pk != request.user.pk:
        raise PermissionDenied(f"wrong password: {doing} was not done")
    request.session[SESSION_KEY] = time.time()


def context(request) -> dict:
    """``password_needed``: forms of those steps show a password field."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "password_needed": not recently_confirmed(request),
        "reauth_minutes": max(1, settings.REAUTH_WINDOW_S // 60),
    }
