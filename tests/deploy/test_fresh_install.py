"""A new installation needs only `migrate` and `retention grants apply`: on a new database
with DEBUG off and a real SECRET_KEY, each process connects with a login of its own (web,
worker, operator; the owner only migrates and grants), the first compliance officers come
from `retention role grant` by the superuser, gunicorn serves the dashboard, a cleanup
qcluster drains a run, and every command works with its production login (docs/deploy.md).
The same deployment on the machine's PostgreSQL 15: test_fresh_install_on_postgresql_15.py."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.deploy.install import deploy_and_operate

pytestmark = [pytest.mark.processes]


def server_of_the_tests() -> dict:
    params = connection.get_connection_params()
    return {
        "host": params.get("host") or "",
        "port": params.get("port") or 5432,
        "user": params.get("user") or "postgres",
    }


def assert_deployed(seen: dict) -> None:
    print("\n".join(f"{label:55} {seconds:6.1f} s" for label, seconds in seen["timings"]))
    # every process with a login of its own, holding exactly what it needs
    assert seen["grants"].count("exactly what it needs") == 4, seen["grants"]
    assert "compliance  alice, carol" in seen["roles"] and "oncall      oscar" in seen["roles"]
    assert "events v1 submitted" in seen["apply"]
    assert seen["health"]["database"] == "ok" and seen["health"]["clusters"]
    assert seen["status"]["state"] == "drained" and seen["status"]["rows_deleted"] > 0
    eligible_left, disputed = seen["left"]
    assert eligible_left == 0 and disputed > 0
    assert 'retention_rows_deleted_total{policy="events"}' in seen["metrics"]
    assert seen["anonymous_metrics"] == 401
    assert seen["plain_http"][0] == 301 and seen["plain_http"][1].startswith("https://")
    assert seen["static"] == 200
    assert all(code == 200 for code in seen["pages"].values()), seen["pages"]
    assert all(code == 200 for code in seen["admin"].values()), seen["admin"]
    assert "every invariant holds" in seen["check"]
    assert "audit chain intact" in seen["verify"]


def test_a_new_database_needs_only_migrate_then_every_command_and_page_works(db, tmp_path):
    seen = deploy_and_operate(server_of_the_tests(), tmp_path, every_command=True)
    assert_deployed(seen)
    commands = seen["commands"]
    for label in ("policy list", "policy preview", "policy apply v2", "policy reject v2",
                  "hold place", "hold list", "hold release", "kill-switch on", "kill-switch off",
                  "status", "drain", "reconcile", "explain", "startup", "role grant", "role revoke"):  # fmt: skip
        assert commands[label][0] == 0, (label, commands[label])
    # commands that do not apply to a drained run or a missing dead letter: one clear line
    for label in ("pause", "resume", "cancel", "confirm", "replay", "discard"):
        code, line = commands[label]
        assert code == 1 and line.startswith("CommandError:"), (label, commands[label])
