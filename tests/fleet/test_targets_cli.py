"""``retention target add|list|remove|migrate``: the registry, its refusals, the ledger."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.models import OperatorAction
from targets import connections as C
from targets.models import Target
from tests.fleet.conftest import SECRET, run_cli, with_password

pytestmark = pytest.mark.django_db(transaction=True)


def test_add_list_remove_a_target(fleet_databases, make_user, act_as, monkeypatch):
    act_as(make_user("olga", "oncall"))
    first = fleet_databases[0]
    # the password in the URL: a trust server ignores it; it must never show
    url = with_password(first.url)
    assert SECRET in url
    monkeypatch.setenv("PAYMENTS_DSN", url)
    out = run_cli("target", "add", "payments", "--dsn-env", "PAYMENTS_DSN", "--group", "pay")
    assert out.strip() == "target payments added in group pay (env PAYMENTS_DSN); it answered"
    target = Target.objects.get(name="payments")
    assert (target.dsn_env, target.dsn_file, target.group) == ("PAYMENTS_DSN", "", "pay")
    assert OperatorAction.objects.filter(action="target.add", actor="olga").count() == 1

    listed = run_cli("target", "list")
    lines = listed.splitlines()
    assert lines[0].split()[0] == "default"
    assert "the control database" in lines[0]
    payments = next(line for line in lines if line.startswith("payments"))
    assert "env PAYMENTS_DSN" in payments and payments.rstrip().endswith("ledger")
    assert SECRET not in listed and url not in listed

    out = run_cli("target", "remove", "payments", "--reason", "moved")
    assert "target payments removed" in out
    assert not Target.objects.exists()
    assert OperatorAction.objects.filter(action="target.remove").count() == 1
    assert "payments" not in run_cli("target", "list")


@pytest.mark.parametrize(
    "dsn, expected",
    [
        (f"postgresql://postgres:{SECRET}@127.0.0.1:1/nowhere", r"^target bad: cannot connect: "),
        ("mysql://nope", r"^target bad must be a postgresql:// URL"),
        (None, r"^target bad: environment variable BAD_DSN is not set here$"),
    ],
)
def test_a_wrong_dsn_is_refused_at_add_with_one_line(make_user, act_as, monkeypatch, dsn, expected):
    act_as(make_user("olga", "oncall"))
    if dsn is None:
        monkeypatch.delenv("BAD_DSN", raising=False)
    else:
        monkeypatch.setenv("BAD_DSN", dsn)
    before = OperatorAction.objects.count()
    with pytest.raises(CommandError, match=expected) as refused:
        call_command("retention", "target", "add", "bad", "--dsn-env", "BAD_DSN")
    message = str(refused.value)
    assert "\n" not in message
    assert SECRET not in message
    assert not Target.objects.exists()
    assert OperatorAction.objects.count() == before


def test_a_dsn_file_names_the_file_and_a_viewer_may_not_add(
    fleet_databases, make_user, act_as, tmp_path
):
    path = tmp_path / "dsn"
    path.write_text(fleet_databases[1].url + "\n")
    act_as(make_user("vera", "viewer"))
    with pytest.raises(CommandError, match="requires one of the roles: oncall"):
        call_command("retention", "target", "add", "messages", "--dsn-file", str(path))
    assert not Target.objects.exists()
    act_as(make_user("olga", "oncall"))
    out = run_cli("target", "add", "messages", "--dsn-file", str(path))
    assert f"(file {path})" in out
    with C.on("messages"):
        assert C.has_ledger()


def test_target_migrate_installs_the_ledger(fleet_databases, make_user, act_as, monkeypatch):
    server = fleet_databases[0].server
    database = server.create_database()
    try:
        monkeypatch.setenv("NEW_DSN", server.admin_url(database))
        act_as(make_user("olga", "oncall"))
        run_cli("target", "add", "fresh", "--dsn-env", "NEW_DSN")
        assert run_cli("target", "list").splitlines()[-1].rstrip().endswith("no ledger")
        out = run_cli("target", "migrate", "fresh")
        assert out.strip() == "target fresh: the ledger is installed"
        with C.on("fresh"):
            assert C.has_ledger()
        assert run_cli("target", "list").splitlines()[-1].rstrip().endswith(" ledger")
    finally:
        C.close_all()
        server.drop_database(database)
