"""Sign-in throttling with django-axes, configured for this deployment.

- The client address is ``REMOTE_ADDR``, unless that is one of ``TRUSTED_PROXIES``: then
  it is the right-most ``X-Forwarded-For`` entry that is not a trusted proxy (what the
  nearest untrusted hop connected from; entries to its left are the client's own claims).
  An IPv6 address counts as its /64 (one host usually holds the whole /64, and picks any
  address in it); an IPv4-mapped IPv6 address as its IPv4 address.
- Usernames count in one form: NFKC-normalized and case-folded (``ＡＬＩＣＥ``, ``Alice`` and
  ``alice`` are one count; so are ``MASSE`` and ``maße``).
- Failures are counted per (username, address): ``LOGIN_FAILURE_LIMIT`` of them lock that
  username from that address. Per username over all addresses there is a ceiling,
  ``LOGIN_USERNAME_CEILING`` (much higher): beyond it, addresses the username never signed
  in from are refused, while an address it signed in from before (axes' access log) is
  slowed down instead — a delay of 1 s, doubling with every ``LOGIN_FAILURE_LIMIT`` further
  failures, at most 16 s — so guesses from many addresses cannot lock the real user out of
  her own.
- Counts last ``LOGIN_FAILURE_WINDOW_S`` after the last failure (axes' cool-off); a
  successful sign-in clears them. Every failure is also kept as evidence
  (``axes.models.AccessFailureLog``, with address, user agent and path; passwords masked).
- Concurrent attempts on one username are serialized by a PostgreSQL advisory lock held
  for the whole sign-in request (``SerializedSignInMiddleware``), so check, password and
  count happen one at a time: parallel guesses cannot overshoot the limit.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
import unicodedata
from contextlib import contextmanager
from functools import lru_cache

from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessLog
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate
from django.contrib.auth.forms import AuthenticationForm
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import render
from django.urls import reverse

pause = time.sleep  # the sign-in delay (tests record it instead of waiting)


@lru_cache(maxsize=8)
def _trusted(proxies: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _is_trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in _trusted(tuple(settings.TRUSTED_PROXIES)))


def _ip(text: str) -> str | None:
    """The address as failures are counted: IPv4 as is, IPv6 as the first address of its
    /64, an IPv4-mapped IPv6 address as the IPv4 address; None when it is none."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False).network_address)
    return str(ip)


def client_address(request) -> str | None:
    """The address a sign-in came from (see the module docstring); None when the peer has
    no IP address (a Unix socket)."""
    remote = _ip(request.META.get("REMOTE_ADDR") or "")
    if remote is None or not _is_trusted(request.META.get("REMOTE_ADDR", "")):
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for hop in reversed([h for h in hops if h]):
        if not _is_trusted(hop):
            return _ip(hop) or remote  # a malformed entry: count it against the proxy
    return remote


def normalized_username(name: str) -> str:
    """The one form a username counts under: NFKC, case-folded, without surrounding space."""
    return unicodedata.normalize("NFKC", name).casefold().strip()[:150]


def username_of(request, credentials) -> str:
    """The username the counts are kept under (``normalized_username``)."""
    name = (credentials or {}).get("username")
    if name is None:
        name = request.POST.get("username", "") if request is not None else ""
    return normalized_username(str(name))


DELAY_FIRST_S = 1.0
DELAY_MAX_S = 16.0


def ceiling_delay(over: int) -> float:
    """How long a sign-in from a known address waits while its username is ``over`` failures
    past the ceiling: 1 s, doubling with every ``LOGIN_FAILURE_LIMIT`` further failures, at
    most 16 s."""
    doublings = min(over // settings.LOGIN_FAILURE_LIMIT, 4)
    return min(DELAY_MAX_S, DELAY_FIRST_S * 2**doublings)


def known_address(request, credentials) -> bool:
    """The username signed in successfully from this address before (axes' access log,
    written at every sign-in, keeps the account's own username and the counted address)."""
    address = getattr(request, "axes_ip_address", None)
    name = str((credentials or {}).get("username") or "").strip()
    if address is None or not name:
        return False
    return AccessLog.objects.filter(username=name, ip_address=address).exists()


class SignInHandler(AxesDatabaseHandler):
    """axes' database handler with the per-username ceiling: a username's failures over
    every address at ``LOGIN_USERNAME_CEILING`` or beyond count as reaching the limit from an
    address it never signed in from, and slow a known address down (``ceiling_delay``)."""

    def _counts(self, request, credentials) -> tuple[int, int]:
        pair, username = (
            sum(a.failures_since_start for a in attempts)
            for attempts in self.get_user_attempts(request, credentials)
        )
        return pair, username

    def get_failures(self, request, credentials=None) -> int:
        pair, username = self._counts(request, credentials)
        if username >= settings.LOGIN_USERNAME_CEILING and not known_address(request, credentials):
            return max(pair, settings.LOGIN_FAILURE_LIMIT)
        return pair

    def is_allowed(self, request, credentials=None) -> bool:
        if not super().is_allowed(request, credentials):
            return False
        _, username = self._counts(request, credentials)
        over = username - settings.LOGIN_USERNAME_CEILING
        if over >= 0 and known_address(request, credentials):
            pause(ceiling_delay(over))
        return True


def lockout_response(request, credentials=None, *args, **kwargs):
    """The sign-in page again, with 429 and why (for the admin's sign-in too); to an API
    caller whose password (asked again for an approval) was refused too often, the API's one
    error shape."""
    minutes = max(1, settings.LOGIN_FAILURE_WINDOW_S // 60)
    if request.path_info.startswith("/api/"):
        return JsonResponse(
            {
                "code": "throttled",
                "message": "too many failed passwords for this username; "
                f"try again in up to {minutes} minutes",
            },
            status=429,
        )
    messages.error(
        request,
        f"Too many failed sign-ins for this username. Try again in up to {minutes} minutes"
        " (from an address you signed in from before, signing in still works, slowly).",
    )

    return render(
        request, "registration/login.html", {"form": AuthenticationForm(request)}, status=429
    )


@contextmanager
def one_at_a_time(username: str):
    """A transaction under a transaction-level advisory lock on the (normalized) username:
    sign-ins of one username, on the pages or the command line, happen one at a time
    (different usernames do not wait)."""
    key = hashlib.sha256(b"sign-in:" + normalized_username(username).encode())
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s)",
                [int.from_bytes(key.digest()[:8], "big", signed=True)],
            )
        yield


class SerializedSignInMiddleware:
    """Sign-in POSTs for one username run one at a time, each in one transaction under
    ``one_at_a_time``."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.method != "POST" or request.path not in _sign_in_paths():
            return self.get_response(request)
        with one_at_a_time(request.POST.get("username", "")):
            return self.get_response(request)


COMMAND_LINE = "(command line)"


class SignInRefused(ValueError):
    """A command-line sign-in failed; the message is one line."""


def authenticate_command_line(username: str, password: str):
    """The command line's password check (``retention token create``, the prompt of a
    state-changing command): Django's ``authenticate()`` through the same backends as the
    sign-in page, so django-axes counts each failure (kept as evidence, path
    ``(command line)``, no address), refuses a locked username even with the right password,
    and an unknown username costs one password hash as a known one does. The user, or
    ``SignInRefused``."""
    request = HttpRequest()
    request.method = "POST"
    request.path = request.path_info = COMMAND_LINE
    request.META = {"HTTP_USER_AGENT": "retention command line", "REMOTE_ADDR": ""}
    with one_at_a_time(username):
        user = authenticate(request, username=username, password=password)
    if user is not None:
        return user
    if getattr(request, "axes_locked_out", False):
        minutes = max(1, settings.LOGIN_FAILURE_WINDOW_S // 60)
        raise SignInRefused(
            f"too many failed sign-ins for {username}; try again in up to {minutes} minutes"
        )
    raise SignInRefused("wrong username or password")


@lru_cache(maxsize=1)
def _sign_in_paths() -> frozenset[str]:
    return frozenset({reverse("login"), reverse("admin:login")})
