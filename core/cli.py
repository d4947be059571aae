"""``retention role grant|revoke|list`` and ``retention user add``: people and their roles
without the demo or a shell. Every change goes through ``core.accounts`` (checks, the
operator log)."""

from __future__ import annotations

import getpass
import sys

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from core import accounts, tokens
from core.cli_identity import acting_user, one_line, password_user
from core.oplog import channel
from core.roles import ALL_ROLES, ROLE_DESCRIPTIONS


def register(areas) -> None:
    role = areas.add_parser("role", help="grant, revoke and list roles")
    sub = role.add_subparsers(dest="role_command", required=True, metavar="COMMAND")
    for name, handler, text in (
        ("grant", role_grant, "give a user a role"),
        ("revoke", role_revoke, "take a role from a user"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("username")
        p.add_argument("role", choices=ALL_ROLES)
        p.add_argument("--reason", default="", help="why (kept in the operator log)")
        p.add_argument("--by", metavar="USERNAME", help="acting superuser or compliance officer")
        p.add_argument(
            "--password-stdin",
            action="store_true",
            help="read your password (asked again for people and roles) from standard input",
        )
        p.set_defaults(handler=handler)
    p = sub.add_parser("list", help="who holds which role")
    p.set_defaults(handler=role_list)

    user = areas.add_parser("user", help="add users")
    sub = user.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    p = sub.add_parser("add", help="create a user (no role yet); the password is prompted")
    p.add_argument("username")
    p.add_argument("--email", default="")
    p.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    p.add_argument("--by", metavar="USERNAME", help="acting superuser or compliance officer")
    p.set_defaults(handler=user_add)

    token = areas.add_parser("token", help="personal API tokens for the command line")
    sub = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "create",
        help="sign in with your password and print a new personal token (as the dashboard's "
        "API tokens page does; how a new installation's superuser gets the first one)",
    )
    p.add_argument("--username", required=True)
    p.add_argument("--name", default="command line", help="what the token is for")
    p.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    p.set_defaults(handler=token_create)


def _via() -> str:
    """``cli``, or ``api`` when the API runs this handler for a request."""
    return channel().get("via") or "cli"


def _subject(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"unknown user {username!r} (add it with `retention user add`)")
    return user


@one_line
def role_grant(command, options) -> None:
    actor = acting_user(options)
    user = _subject(options["username"])
    accounts.check_manager(actor, subject=user)  # a refusal names the role before any prompt
    with _password_again(actor, options, read_line=bool(options.get("password_stdin"))):
        changed = accounts.grant_role(
            user, options["role"], actor=actor, reason=options["reason"], via=_via()
        )
    verb = "granted to" if changed else "already held by"
    command.stdout.write(f"{options['role']} {verb} {user.username}")


def _password_again(actor, options, *, read_line: bool = False):
    """People and roles need the acting superuser's password again (``core.accounts``):
    given at the prompt that signed in this command, by the API that called it, or now — at a
    terminal, or as a line of standard input (``--password-stdin``)."""
    if accounts.is_password_confirmed(actor) or channel().get("auth") == "password":
        return accounts.password_confirmed(actor)
    if read_line:
        password = sys.stdin.readline().rstrip("\n")
    elif sys.stdin is not None and sys.stdin.isatty():
        password = getpass.getpass(f"{actor.username}'s password (asked again): ")
    else:
        raise CommandError(
            "people and roles need your password again (a token alone changes no one): run "
            "it at a terminal, or give it with --password-stdin"
        )
    if password_user(actor.username, password).pk != actor.pk:
        raise CommandError("wrong password: nothing was changed")
    return accounts.password_confirmed(actor)


@one_line
def role_revoke(command, options) -> None:
    actor = acting_user(options)
    user = _subject(options["username"])
    accounts.check_manager(actor, subject=user)  # a refusal names the role before any prompt
    with _password_again(actor, options, read_line=bool(options.get("password_stdin"))):
        changed = accounts.revoke_role(
            user, options["role"], actor=actor, reason=options["reason"], via=_via()
        )
    verb = "revoked from" if changed else "not held by"
    command.stdout.write(f"{options['role']} {verb} {user.username}")


def role_list(command, options) -> None:
    for role, names in accounts.memberships().items():
        command.stdout.write(f"{role:11} {', '.join(names) or '-'}   ({ROLE_DESCRIPTIONS[role]})")
    command.stdout.write(
        f"{'superusers':11} {', '.join(accounts.superusers()) or '-'}   (every role)"
    )


@one_line
def user_add(command, options) -> None:
    actor = acting_user(options)
    accounts.check_manager(actor)  # a refusal names the role before any prompt
    if options["password_stdin"]:
        password = sys.stdin.readline().rstrip("\n")
    elif sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password (again): ") != password:
            raise CommandError("the passwords differ")
    else:
        raise CommandError("no terminal to prompt for a password: use --password-stdin")
    # with a token, the acting superuser's own password follows (the next line of stdin)
    with _password_again(actor, options, read_line=bool(options["password_stdin"])):
        user = accounts.add_user(options["username"], password, actor=actor, email=options["email"])
    command.stdout.write(f"user {user.username} added (no role yet)")


@one_line
def token_create(command, options) -> None:
    """The token is printed once, alone on stdout (``export RETENTION_TOKEN=$(…)``)."""
    if options["password_stdin"]:
        password = sys.stdin.readline().rstrip("\n")
    elif sys.stdin.isatty():
        password = getpass.getpass("Password: ")
    else:
        raise CommandError("no terminal to prompt for a password: use --password-stdin")
    user = password_user(options["username"].strip(), password)
    try:
        token, secret = tokens.create_token(user, name=options["name"], via="cli")
    except tokens.TokenError as exc:
        raise CommandError(str(exc)) from None
    command.stderr.write(f"token {token.prefix}… created for {user.username}; shown once")
    command.stdout.write(secret)
