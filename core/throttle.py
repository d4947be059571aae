"""Failed sign-ins are throttled per (username, client address) in the shared cache.

``LOGIN_FAILURE_LIMIT`` failures (default 5) within ``LOGIN_FAILURE_WINDOW_S`` (default
15 minutes) lock that username from that address until the oldest failure leaves the window.
The check sits in the authentication backend, so every sign-in path (the login page, the
admin) obeys it; the login page answers a locked attempt with 429 and says why. While locked,
even the right password is refused. The cache is the database cache shared by all processes,
so the count holds across web workers (not atomically: parallel guesses can overshoot the
limit by the number of workers, which still caps guessing at a handful per window).
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied


def limit() -> int:
    return settings.LOGIN_FAILURE_LIMIT


def window_s() -> int:
    return settings.LOGIN_FAILURE_WINDOW_S


def client_address(request) -> str:
    """The peer address. Behind a proxy, the proxy must set REMOTE_ADDR (e.g. gunicorn's
    ``--forwarded-allow-ips``); X-Forwarded-For from a client is never trusted here."""
    return (request.META.get("REMOTE_ADDR") or "unknown")[:64]


def _key(username: str, address: str) -> str:
    digest = hashlib.sha256(f"{(username or '').strip().lower()}\x1f{address}".encode())
    return "login-failures:" + digest.hexdigest()


def _recent(key: str, now: float) -> list[float]:
    stamps = cache.get(key) or []
    return [t for t in stamps if now - t < window_s()]


def is_locked(username: str, address: str) -> bool:
    return len(_recent(_key(username, address), time.time())) >= limit()


def record_failure(username: str, address: str) -> int:
    """Count one failed attempt; returns the failures now in the window."""
    now = time.time()
    key = _key(username, address)
    stamps = (_recent(key, now) + [now])[-limit() :]
    cache.set(key, stamps, timeout=window_s())
    return len(stamps)


def reset(username: str, address: str) -> None:
    cache.delete(_key(username, address))


class ThrottledModelBackend(ModelBackend):
    """ModelBackend that refuses a locked (username, address) before checking the password."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return super().authenticate(request, username=username, password=password, **kwargs)
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        address = client_address(request)
        if is_locked(username or "", address):
            raise PermissionDenied("too many failed sign-ins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            record_failure(username or "", address)
        else:
            reset(username or "", address)
        return user
