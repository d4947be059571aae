"""Roles without the demo: the groups come from `migrate`; `retention role grant|revoke|list`
and `retention user add` change them through checked, logged actions; the admin only shows them."""

from __future__ import annotations

import contextlib
import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError

from core import accounts
from core.models import OperatorAction
from core.roles import ALL_ROLES, roles_of
from tests.conftest import token_for_claim

pytestmark = pytest.mark.django_db


def retention(*args, stdin: str | None = None) -> str:
    token_for_claim(args)  # act as the user --by names, with a token of theirs
    # the password asked again for people and roles: given (these tests are about the roles;
    # tests/security/test_decisions.py refuses a token without it)
    by = (
        User.objects.filter(username=args[args.index("--by") + 1]).first()
        if "--by" in args
        else None
    )
    with accounts.password_confirmed(by) if by is not None else contextlib.nullcontext():
        return _retention(*args, stdin=stdin)


def _retention(*args, stdin: str | None = None) -> str:
    out = io.StringIO()
    if stdin is not None:
        import sys

        old, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            call_command("retention", *args, stdout=out)
        finally:
            sys.stdin = old
    else:
        call_command("retention", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def root(db):
    return User.objects.create_superuser("root", "root@example.com", "root-pw-long-enough")


def test_migrate_creates_the_four_role_groups():
    assert set(Group.objects.filter(name__in=ALL_ROLES).values_list("name", flat=True)) == set(
        ALL_ROLES
    )


def test_a_superuser_grants_the_first_compliance_officer_and_the_log_says_who_what_whom_why(root):
    alice = User.objects.create_user("alice", password="x" * 12)
    out = retention("role", "grant", "alice", "compliance", "--by", "root", "--reason", "first CO")
    assert "compliance granted to alice" in out
    assert roles_of(User.objects.get(pk=alice.pk)) == {"compliance"}
    row = OperatorAction.objects.get(action="role.grant")
    assert (row.actor, row.target_type, row.target_id, row.reason) == (
        "root",
        "user",
        str(alice.pk),
        "first CO",
    )
    assert row.details["via"] == "cli" and row.details["token"].startswith("rrt_")
    assert (row.details["role"], row.details["username"]) == ("compliance", "alice")


def test_a_superuser_grants_and_revokes_and_each_change_is_logged(root):
    User.objects.create_user("alice", password="x" * 12)
    User.objects.create_user("oscar", password="x" * 12)
    retention("role", "grant", "alice", "compliance", "--by", "root")
    retention("role", "grant", "oscar", "oncall", "--by", "root", "--reason", "rota")
    assert "oncall already held by oscar" in retention(
        "role", "grant", "oscar", "oncall", "--by", "root"
    )
    listing = retention("role", "list")
    assert "oncall      oscar" in listing and "compliance  alice" in listing
    assert "superusers  root" in listing
    assert "oncall revoked from oscar" in retention(
        "role", "revoke", "oscar", "oncall", "--by", "root", "--reason", "left the rota"
    )
    assert roles_of(User.objects.get(username="oscar")) == frozenset()
    actions = list(
        OperatorAction.objects.filter(action__startswith="role.")
        .order_by("id")
        .values_list("actor", "action", "details__username", "details__role", "reason")
    )
    assert actions == [
        ("root", "role.grant", "alice", "compliance", ""),
        ("root", "role.grant", "oscar", "oncall", "rota"),
        ("root", "role.revoke", "oscar", "oncall", "left the rota"),
    ]


def test_one_compliance_officer_cannot_make_a_second_account_to_pass_four_eyes_alone(
    root, make_user
):
    make_user("alice", "compliance")
    make_user("carol", "compliance")
    before = (User.objects.count(), OperatorAction.objects.count())
    with pytest.raises(CommandError, match="that takes a superuser"):
        retention(
            "user", "add", "alice2", "--by", "alice", "--password-stdin",
            stdin="alice2-password-long\n",
        )  # fmt: skip
    make_user("alice2")  # even when the account exists, she cannot empower it
    with pytest.raises(CommandError, match="that takes a superuser"):
        retention("role", "grant", "alice2", "compliance", "--by", "alice")
    # nor take a protection away from the other approvers
    with pytest.raises(CommandError, match="that takes a superuser"):
        retention("role", "revoke", "carol", "compliance", "--by", "alice")
    assert roles_of(User.objects.get(username="alice2")) == frozenset()
    assert roles_of(User.objects.get(username="carol")) == {"compliance"}
    assert (User.objects.count(), OperatorAction.objects.count()) == (before[0] + 1, before[1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("grant", "oscar", "oncall", "--by", "victor"), "may not manage people or roles"),
        (("grant", "oscar", "oncall", "--by", "alice"), "that takes a superuser"),
        (("grant", "root", "oncall", "--by", "root"), "nobody changes their own roles"),
        (("grant", "oscar", "oncall"), "set RETENTION_TOKEN"),
        (("grant", "oscar", "oncall", "--by", "nobody"), "set RETENTION_TOKEN"),
        (("grant", "nobody", "oncall", "--by", "root"), "unknown user 'nobody'"),
        (("revoke", "oscar", "viewer", "--by", "oscar"), "may not manage people or roles"),
    ],
)
def test_a_refused_role_change_is_one_error_and_changes_nothing(root, make_user, args, message):
    make_user("alice", "compliance")
    make_user("oscar")
    make_user("victor", "viewer")
    before = (
        list(User.groups.through.objects.order_by("id").values_list("user_id", "group_id")),
        OperatorAction.objects.count(),
    )
    with pytest.raises(CommandError, match=message):
        retention("role", *args)
    after = (
        list(User.groups.through.objects.order_by("id").values_list("user_id", "group_id")),
        OperatorAction.objects.count(),
    )
    assert after == before


def test_an_unknown_role_is_refused_by_the_command_line(root):
    with pytest.raises(CommandError, match="invalid choice"):
        retention("role", "grant", "root", "admin", "--by", "root")


def test_user_add_creates_a_user_without_roles_and_logs_it(root):
    out = retention(
        "user", "add", "carol", "--by", "root", "--password-stdin", stdin="carol-pw-12345\n"
    )
    assert "user carol added" in out
    carol = User.objects.get(username="carol")
    assert carol.check_password("carol-pw-12345") and roles_of(carol) == frozenset()
    assert OperatorAction.objects.filter(action="user.create", actor="root").count() == 1
    with pytest.raises(CommandError, match="already exists"):
        retention(
            "user", "add", "carol", "--by", "root", "--password-stdin", stdin="another-pw-123\n"
        )
    with pytest.raises(CommandError, match="password refused"):
        retention("user", "add", "dave", "--by", "root", "--password-stdin", stdin="short\n")
    assert not User.objects.filter(username="dave").exists()


def test_the_admin_shows_role_memberships_but_does_not_change_them(client, root, make_user):
    make_user("alice", "compliance")
    client.force_login(root)
    compliance = Group.objects.get(name="compliance")
    page = client.get("/admin/auth/group/", secure=True)
    assert page.status_code == 200 and b"alice" in page.content
    assert client.get("/admin/auth/group/add/", secure=True).status_code == 403
    oncall = Group.objects.get(name="oncall")
    alice = User.objects.get(username="alice")
    page = client.get(f"/admin/auth/user/{alice.pk}/change/", secure=True)
    assert page.status_code == 200 and b'name="groups"' not in page.content
    client.post(
        f"/admin/auth/user/{alice.pk}/change/",
        {"username": "alice", "groups": [oncall.pk], "date_joined_0": "2026-01-01",
         "date_joined_1": "00:00:00", "is_active": "on"},
        secure=True,
    )  # fmt: skip
    assert set(alice.groups.values_list("pk", flat=True)) == {compliance.pk}
    assert (
        client.post(
            f"/admin/auth/group/{compliance.pk}/delete/", {"post": "yes"}, secure=True
        ).status_code
        == 403
    )
    assert Group.objects.filter(pk=compliance.pk).exists()


def test_a_new_installations_superuser_gets_a_token_with_their_password(root):
    with pytest.raises(CommandError, match="wrong username or password"):
        retention("token", "create", "--username", "root", "--password-stdin", stdin="nope\n")
    secret = retention(
        "token", "create", "--username", "root", "--password-stdin", stdin="root-pw-long-enough\n"
    ).strip()
    assert secret.startswith("rrt_")
    import os

    os.environ["RETENTION_TOKEN"] = secret  # undone after the test (tests/conftest.py)
    User.objects.create_user("alice", password="x" * 12)
    # with a token, the password once more (a token alone changes no one)
    out = _retention(
        "role", "grant", "alice", "compliance", "--password-stdin", stdin="root-pw-long-enough\n"
    )
    assert "compliance granted to alice" in out
    created = OperatorAction.objects.get(action="token.create")
    assert (created.actor, created.details["via"]) == ("root", "cli")


@pytest.mark.django_db(transaction=True)
def test_the_role_groups_come_back_after_the_tables_are_flushed():
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    assert set(Group.objects.filter(name__in=ALL_ROLES).values_list("name", flat=True)) == set(
        ALL_ROLES
    )
