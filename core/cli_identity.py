"""Who a state-changing CLI command acts as — the one place that decides it.

``acting_user(options)`` returns the person behind the command:

- ``RETENTION_TOKEN`` in the environment: a personal API token its owner created on the
  dashboard's API tokens page (``core.tokens``);
- else, at a terminal, a username and password prompt (the bootstrap of a new
  installation: ``manage.py createsuperuser``, then act as that superuser).

- within an API request (``api``): the owner of the request's bearer token, authenticated
  by the API before any handler runs (``acting_as``); the rows then say ``via: api``.

Nothing else: a ``--by``/``--author``/``--approver`` flag only double-checks the
identity (a mismatch is refused), it never chooses it. The command's operator-action rows
say ``via: cli`` and which token (``core.oplog.record_action`` reads ``channel()``), and the actions
check this user's roles exactly as the pages do.
"""

from __future__ import annotations

import getpass
import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from core.oplog import reset_channel, set_channel
from core.signin import SignInRefused, authenticate_command_line
from core.tokens import TokenError, user_for_token

TOKEN_ENV = "RETENTION_TOKEN"
CLAIM_FLAGS = ("by", "author", "approver")

_acting: ContextVar[tuple | None] = ContextVar("retention_acting", default=None)


@contextmanager
def cli_command():
    """The scope of one CLI command: what ``acting_user`` establishes ends with it."""
    reset = set_channel(None)
    try:
        yield
    finally:
        reset_channel(reset)


def act_for_request(user, via: dict) -> None:
    """Within one API request: the person its token authenticated acts in every handler
    and action the request runs, and their operator-log rows carry ``via`` (``via: api``).
    The API runs each request in a context of its own (``api.urls``), so this ends with it."""
    _acting.set((user, via))
    set_channel(via)


def acting_user(options: dict | None = None):
    """The authenticated user a CLI command acts as; one clear ``CommandError`` otherwise."""
    options = options or {}
    secret = os.environ.get(TOKEN_ENV, "").strip()
    if _acting.get() is not None:
        user, via = _acting.get()
    elif secret:
        try:
            user, token = user_for_token(secret)
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        via = {"via": "cli", "token": token.prefix}
    elif sys.stdin is not None and sys.stdin.isatty():
        user = _password_prompt()
        via = {"via": "cli", "auth": "password"}
    else:
        raise CommandError(
            f"this command acts as a person: set {TOKEN_ENV} to your personal API token "
            "(dashboard → API tokens), or run it at a terminal to sign in with a password"
        )
    for flag in CLAIM_FLAGS:
        claimed = (options.get(flag) or "").strip()
        if claimed and claimed != user.username:
            raise CommandError(
                f"--{flag} {claimed} is not who is acting: the credential is {user.username}'s"
            )
    set_channel(via)
    return user


def _password_prompt():
    username = input("Username: ").strip()
    password = getpass.getpass("Password: ")
    return password_user(username, password)


def password_user(username: str, password: str):
    """The active user with this password, checked as the sign-in page checks it (counted
    and throttled by django-axes: ``core.signin.authenticate_command_line``)."""
    try:
        return authenticate_command_line(username, password)
    except SignInRefused as exc:
        raise CommandError(str(exc)) from None


def one_line(handler):
    """Refusals from the actions become the command's single error line."""

    @wraps(handler)
    def wrapped(command, options):
        try:
            return handler(command, options)
        except PermissionDenied as exc:
            raise CommandError(str(exc) or "permission denied") from None

    return wrapped
