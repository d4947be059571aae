"""The shipped systemd units (deploy/systemd) give each process its own Unix user and its own
database login: workers never load the owner's or the web's login, the evidence key is in
the checkpoint job's file only, and no unit loads the owner's file."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"


def unit(name: str) -> dict[str, list[str]]:
    """The [Service] section's settings, each key with every value it is given."""
    values: dict[str, list[str]] = {}
    section = None
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def env(name: str) -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.optionxform = str
    parser.read_string("[env]\n" + (UNITS / name).read_text())
    return dict(parser["env"])


def login_of(name: str) -> str:
    return re.match(r"postgresql://([^:@]+)", env(name)["DATABASE_URL"]).group(1)


def test_each_process_runs_as_its_own_user_with_its_own_database_login():
    web = unit("retention-web.service")
    assert web["User"] == ["retention-web"]
    assert web["EnvironmentFile"] == [
        "/etc/retention-runner/common.env",
        "/etc/retention-runner/web.env",
    ]
    for name in ("retention-cleanup@.service", "retention-deadline.service"):
        worker = unit(name)
        assert worker["User"] == ["retention-worker"], name
        assert worker["EnvironmentFile"] == [
            "/etc/retention-runner/common.env",
            "/etc/retention-runner/worker.env",
        ], name
    assert (login_of("web.env.example"), login_of("worker.env.example")) == (
        "retention_web",
        "retention_worker",
    )
    assert login_of("monitor.env.example") == "retention_monitor"
    checkpoint = unit("retention-checkpoint.service")  # started by retention-checkpoint.timer
    assert checkpoint["User"] == ["retention-monitor"]
    assert checkpoint["EnvironmentFile"] == [
        "/etc/retention-runner/common.env",
        "/etc/retention-runner/monitor.env",
    ]
    assert checkpoint["ExecStart"][0].endswith("manage.py retention audit checkpoint")
    assert "OnCalendar=hourly" in (UNITS / "retention-checkpoint.timer").read_text()
    assert login_of("owner.env.example") == "retention_owner"


def test_no_unit_loads_the_owners_login_and_only_the_checkpoint_job_holds_the_evidence_key():
    for path in UNITS.glob("*.service"):
        text = path.read_text()
        assert "owner.env" not in text, path.name
    common = env("common.env.example")
    assert "DATABASE_URL" not in common, "each unit's login comes from its own file"
    holders = [
        path.name
        for path in UNITS.glob("*.env.example")
        if "RETENTION_EVIDENCE_KEY" in "".join(env(path.name))
    ]
    assert holders == ["monitor.env.example"]
    signers = [
        path.name
        for path in UNITS.glob("*.env.example")
        if "RETENTION_SIGNING_KEY" in "".join(env(path.name))
    ]
    assert signers == ["web.env.example"], "only the web host signs decisions"


def test_the_shipped_grants_are_what_the_grants_command_runs(db):
    """deploy/sql/grants.sql is `retention grants sql`'s output: the file a DBA may run with
    psql and the statements `retention grants apply` runs never drift apart."""
    from targets.grants_cli import render_sql

    assert (ROOT / "deploy" / "sql" / "grants.sql").read_text() == render_sql()
