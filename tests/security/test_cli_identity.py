"""The command line acts as an authenticated person: a personal API token from the
dashboard, never a name typed on the command line. Same roles as the pages; the operator
log says the change came from the CLI and with which token."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from core.models import ApiToken, OperatorAction
from core.tokens import create_token
from retention import actions
from retention.models import KillSwitch, LegalHold, PolicyVersion
from tests.retention import conftest as retention_fixtures
from tests.retention.conftest import policy_toml

events_table = retention_fixtures.events_table  # the fixture, shared with tests/retention


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("retention", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def policy_file(events_table, tmp_path):
    path = tmp_path / "events.toml"
    path.write_text(policy_toml(), encoding="utf-8")
    return str(path)


@pytest.fixture
def people(make_user):
    return {
        "alice": make_user("alice", "compliance"),
        "carol": make_user("carol", "compliance"),
        "olga": make_user("olga", "oncall"),
        "vera": make_user("vera", "viewer"),
    }


def test_without_a_token_no_state_changing_command_runs(people, policy_file, monkeypatch):
    monkeypatch.delenv("RETENTION_TOKEN", raising=False)
    hold = actions.place_hold(actor=people["alice"], reason="case 1")
    before = OperatorAction.objects.count()
    for args in (
        ("policy", "apply", policy_file, "--author", "alice", "--reason", "ready for review"),
        ("hold", "place", "--reason", "x", "--by", "alice"),
        ("hold", "release", str(hold.pk), "--reason", "x", "--by", "alice"),
        ("kill-switch", "on", "--reason", "x"),
        ("kill-switch", "on", "--reason", "x", "--by", "olga"),
    ):
        with pytest.raises(CommandError, match="set RETENTION_TOKEN"):
            cli(*args)
    assert OperatorAction.objects.count() == before
    assert LegalHold.objects.get().active and not KillSwitch.is_on()
    assert not PolicyVersion.objects.exists()


def test_one_person_cannot_write_and_approve_under_two_names(people, policy_file, act_as):
    act_as(people["alice"])
    cli("policy", "apply", policy_file, "--author", "alice", "--reason", "ready for review")

    with pytest.raises(CommandError, match="--approver carol is not who is acting.*alice's"):
        cli("policy", "approve", "events", "--version", "1", "--approver", "carol")
    with pytest.raises(CommandError, match="alice wrote events v1 and cannot approve it"):
        cli("policy", "approve", "events", "--version", "1", "--reason", "mine")
    assert PolicyVersion.objects.get().state == "submitted"

    token = act_as(people["carol"])
    cli("policy", "approve", "events", "--version", "1", "--reason", "reviewed")
    version = PolicyVersion.objects.get()
    assert (version.state, version.decided_by.username) == ("approved", "carol")
    row = OperatorAction.objects.get(action="version.approve")
    assert row.actor == "carol"
    assert row.details["via"] == "cli" and row.details["token"] == token[:12]
    assert OperatorAction.objects.get(action="version.create").details["via"] == "cli"


def test_a_flag_naming_someone_else_is_refused(people, act_as):
    hold = actions.place_hold(actor=people["alice"], reason="case 1")
    act_as(people["vera"])
    with pytest.raises(CommandError, match="--by alice is not who is acting"):
        cli("hold", "release", str(hold.pk), "--reason", "closed", "--by", "alice")
    assert LegalHold.objects.get().active


@pytest.mark.parametrize(
    ("who", "args", "refusal"),
    [
        ("vera", ("hold", "place", "--reason", "x"), "requires one of the roles: compliance"),
        ("olga", ("hold", "place", "--reason", "x"), "requires one of the roles: compliance"),
        ("alice", ("kill-switch", "on", "--reason", "x"), "requires one of the roles: oncall"),
        ("vera", ("kill-switch", "on", "--reason", "x"), "requires one of the roles: oncall"),
    ],
)
def test_the_token_owner_needs_the_same_role_as_on_the_pages(people, act_as, who, args, refusal):
    act_as(people[who])
    with pytest.raises(CommandError, match=refusal):
        cli(*args)
    assert not LegalHold.objects.exists() and not KillSwitch.is_on()


def test_on_call_commands_act_as_the_token_owner(people, act_as):
    act_as(people["olga"])
    cli("kill-switch", "on", "--reason", "incident 7")
    switch = KillSwitch.objects.get()
    assert switch.on and switch.changed_by == "olga"
    row = OperatorAction.objects.get(action="kill_switch.on")
    assert (row.actor, row.details["via"]) == ("olga", "cli")


def test_a_revoked_unknown_or_inactive_owners_token_is_refused(people, act_as, monkeypatch):
    secret = act_as(people["olga"])
    token = ApiToken.objects.get()
    from core.tokens import revoke_token

    revoke_token(token, actor=people["olga"])
    with pytest.raises(CommandError, match="was revoked"):
        cli("kill-switch", "on", "--reason", "x")
    monkeypatch.setenv("RETENTION_TOKEN", secret[:-2] + "xx")
    with pytest.raises(CommandError, match="not a known token"):
        cli("kill-switch", "on", "--reason", "x")
    act_as(people["olga"])
    people["olga"].is_active = False
    people["olga"].save()
    with pytest.raises(CommandError, match="inactive"):
        cli("kill-switch", "on", "--reason", "x")
    assert not KillSwitch.is_on()


def test_a_password_at_a_terminal_is_the_other_way_to_act(people, monkeypatch):
    monkeypatch.delenv("RETENTION_TOKEN", raising=False)
    monkeypatch.setattr("sys.stdin", type("Tty", (io.StringIO,), {"isatty": lambda self: True})())
    monkeypatch.setattr("builtins.input", lambda prompt: "olga")
    monkeypatch.setattr("getpass.getpass", lambda prompt: "wrong")
    with pytest.raises(CommandError, match="wrong username or password"):
        cli("kill-switch", "on", "--reason", "x")
    monkeypatch.setattr("getpass.getpass", lambda prompt: "olga-pw")
    cli("kill-switch", "on", "--reason", "x")
    row = OperatorAction.objects.get(action="kill_switch.on")
    assert (row.actor, row.details["via"], row.details["auth"]) == ("olga", "cli", "password")


def test_a_token_is_shown_once_stored_hashed_and_revoked_on_the_page(people, client):
    client.force_login(people["olga"])
    refused = client.post(reverse("tokens"), {"name": "laptop"})
    assert refused.status_code == 403 and not ApiToken.objects.exists()
    assert "enter your password to confirm a new token" in refused.content.decode()
    page = client.post(reverse("tokens"), {"name": "laptop", "password": "olga-pw"})
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    secret = page.context["created"]
    assert secret.startswith("rrt_") and len(secret) > 40 and secret in page.content.decode()
    token = ApiToken.objects.get()
    assert token.digest == ApiToken.digest_of(secret) and secret not in token.digest
    assert (token.user, token.name, token.prefix) == (people["olga"], "laptop", secret[:12])
    assert secret not in client.get(reverse("tokens")).content.decode()
    created = OperatorAction.objects.get(action="token.create")
    assert created.actor == "olga" and secret not in str(created.details)

    other, _ = create_token(people["vera"], name="vera's")
    assert client.post(reverse("token_revoke", args=[other.pk])).status_code == 404
    client.post(reverse("token_revoke", args=[token.pk]))
    token.refresh_from_db()
    other.refresh_from_db()
    assert token.revoked_at is not None and other.revoked_at is None
    assert OperatorAction.objects.filter(action="token.revoke", actor="olga").count() == 1


def test_someone_without_a_role_gets_no_token(make_user, client):
    client.force_login(make_user("nobody"))
    assert client.post(reverse("tokens"), {"name": "x"}).status_code == 403
    assert not ApiToken.objects.exists()


def at_a_terminal(monkeypatch, username: str, password: str) -> None:
    monkeypatch.delenv("RETENTION_TOKEN", raising=False)
    monkeypatch.setattr("sys.stdin", type("Tty", (io.StringIO,), {"isatty": lambda self: True})())
    monkeypatch.setattr("builtins.input", lambda prompt: username)
    monkeypatch.setattr("getpass.getpass", lambda prompt: password)


def token_create(username: str, password: str, monkeypatch) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    return cli("token", "create", "--username", username, "--password-stdin")


def test_wrong_passwords_at_the_prompt_count_and_lock_like_the_sign_in_page(
    people, monkeypatch, settings
):
    from axes.models import AccessFailureLog

    for n in range(1, settings.LOGIN_FAILURE_LIMIT + 1):  # the fifth failure locks
        at_a_terminal(monkeypatch, "olga", "wrong")
        refusal = "wrong username or password" if n < 5 else "too many failed sign-ins"
        with pytest.raises(CommandError, match=refusal):
            cli("kill-switch", "on", "--reason", "x")
    at_a_terminal(monkeypatch, "olga", "olga-pw")
    with pytest.raises(CommandError, match="too many failed sign-ins for olga"):
        cli("kill-switch", "on", "--reason", "x")
    assert not KillSwitch.is_on()
    failures = AccessFailureLog.objects.filter(username="olga")
    assert failures.count() == settings.LOGIN_FAILURE_LIMIT + 1  # the refused one too
    # the fifth wrong password locked, and the right one after it was refused
    assert failures.filter(locked_out=True).count() == 2


def test_token_create_counts_wrong_passwords_and_locks_like_the_sign_in_page(
    people, monkeypatch, settings
):
    for n in range(1, settings.LOGIN_FAILURE_LIMIT + 1):
        refusal = "wrong username or password" if n < 5 else "too many failed sign-ins"
        with pytest.raises(CommandError, match=refusal):
            token_create("olga", "wrong", monkeypatch)
    with pytest.raises(CommandError, match="too many failed sign-ins for olga"):
        token_create("olga", "olga-pw", monkeypatch)
    assert not ApiToken.objects.exists()
    assert not OperatorAction.objects.filter(action="token.create").exists()


def test_an_unknown_username_costs_a_password_hash_like_a_known_one(people, monkeypatch):
    """Without it, the answer's speed tells which usernames exist. Counted on the hasher the
    settings make the default (the product's PBKDF2; the suite's MD5, tests/conftest.py)."""
    from django.contrib.auth.hashers import get_hasher

    computed = []
    hasher = type(get_hasher())
    original = hasher.encode

    def counting(self, password, salt, *args, **kwargs):
        computed.append(password)
        return original(self, password, salt, *args, **kwargs)

    monkeypatch.setattr(hasher, "encode", counting)
    for n, username in enumerate(("olga", "nobody-by-that-name")):
        computed.clear()
        with pytest.raises(CommandError, match="wrong username or password"):
            token_create(username, f"unguessable-{n}-{username}", monkeypatch)
        assert computed == [f"unguessable-{n}-{username}"], username
