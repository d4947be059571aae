from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from core.models import OperatorAction
from retention.models import LegalHold, Policy, PolicyVersion
from tests.conftest import token_for_claim

from .conftest import policy_toml


def run_cli(*args: str) -> str:
    token_for_claim(args)
    out = io.StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def db_state() -> tuple:
    return (
        Policy.objects.count(),
        PolicyVersion.objects.count(),
        LegalHold.objects.count(),
        OperatorAction.objects.count(),
        list(PolicyVersion.objects.values_list("pk", "state").order_by("pk")),
    )


def test_apply_creates_a_submitted_version_and_prints_slug_number_state_and_hash(
    events_table, alice, write_policy
):
    out = run_cli(
        "policy", "apply", write_policy(), "--author", "alice", "--reason", "ready for review"
    )

    version = PolicyVersion.objects.get()
    assert out.splitlines()[0] == f"events v1 submitted {version.content_hash}"
    assert version.state == "submitted"
    assert version.author == alice
    assert version.preview["eligible"] > 0
    assert version.validation["supporting_index"] == "t_events_tenant_id"
    policy = Policy.objects.get(slug="events")
    assert (policy.name, policy.schedule, policy.timezone) == (
        "Old events",
        "0 3 * * *",
        "Europe/Berlin",
    )
    assert list(OperatorAction.objects.order_by("id").values_list("action", flat=True)) == [
        "policy.create",
        "version.create",
        "version.submit",
    ]


def test_submitting_without_a_reason_is_refused_by_the_command_and_leaves_nothing(
    events_table, alice, write_policy
):
    before = db_state()
    for reason in ([], ["--reason", "  "]):
        with pytest.raises(CommandError, match="^submitting a version needs a reason$"):
            run_cli("policy", "apply", write_policy(), "--author", "alice", *reason)
    assert db_state() == before  # not even a draft: one transaction


def test_applying_the_same_content_again_finds_the_existing_version(
    events_table, alice, write_policy
):
    path = write_policy()
    run_cli("policy", "apply", path, "--author", "alice", "--reason", "ready for review")
    before = db_state()

    out = run_cli("policy", "apply", path, "--author", "alice", "--reason", "ready for review")

    assert out.startswith("events v1 submitted ")
    assert db_state() == before


def test_applying_changed_content_makes_a_new_version(events_table, alice, write_policy):
    run_cli("policy", "apply", write_policy(), "--author", "alice", "--reason", "ready for review")

    out = run_cli(
        "policy",
        "apply",
        write_policy(retention='"60 days"'),
        "--author",
        "alice",
        "--reason",
        "ready for review",
    )

    assert out.startswith("events v2 submitted ")
    assert list(PolicyVersion.objects.order_by("number").values_list("number", "state")) == [
        (1, "submitted"),
        (2, "submitted"),
    ]


BAD_INPUTS = {
    "malformed TOML": ("slug = 'events\nthis is not toml", "malformed TOML"),
    "an unknown key": (policy_toml(colour='"blue"'), "unknown key in the policy: colour"),
    "a bad cron": (policy_toml(schedule='"61 * * * *"'), "schedule must be a five-field cron"),
    "an unknown timezone": (policy_toml(timezone='"Mars/Olympus"'), "'Mars/Olympus'"),
    "zero retention": (policy_toml(retention='"0 days"'), "retention must be longer than zero"),
    "negative retention": (policy_toml(retention='"-5 days"'), "retention must look like"),
    "an unknown table": (policy_toml(table='"public.nope"'), "table public.nope does not exist"),
    "an unknown column": (
        policy_toml(timestamp='"created"'),
        "timestamp column 'created' does not exist in table public.t_events",
    ),
    "an unknown keep column": (
        policy_toml(tables='[[keep]]\ncolumn = "flag"\nop = "="\nvalue = "x"\n'),
        "keep[0] column 'flag' does not exist",
    ),
    "a keep value the column cannot hold": (
        policy_toml(tables='[[keep]]\ncolumn = "tenant_id"\nop = "="\nvalue = "abc"\n'),
        "column 'tenant_id'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_policy_files_give_one_error_line_and_change_nothing(
    case, events_table, alice, write_policy
):
    text, expected = BAD_INPUTS[case]
    before = db_state()

    with pytest.raises(CommandError) as excinfo:
        run_cli(
            "policy",
            "apply",
            write_policy(text),
            "--author",
            "alice",
            "--reason",
            "ready for review",
        )

    message = str(excinfo.value)
    assert expected in message
    assert "\n" not in message
    assert db_state() == before


def test_an_unknown_author_gives_one_error_line_and_changes_nothing(events_table, write_policy):
    before = db_state()
    with pytest.raises(CommandError, match="set RETENTION_TOKEN"):
        run_cli(
            "policy", "apply", write_policy(), "--author", "mallory", "--reason", "ready for review"
        )
    assert db_state() == before


def test_an_author_without_the_compliance_role_is_refused(events_table, olga, write_policy):
    before = db_state()
    with pytest.raises(CommandError, match="requires one of the roles: compliance"):
        run_cli(
            "policy", "apply", write_policy(), "--author", "olga", "--reason", "ready for review"
        )
    assert db_state() == before


def test_a_missing_file_gives_one_error_line(alice, tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run_cli(
            "policy",
            "apply",
            str(tmp_path / "absent.toml"),
            "--author",
            "alice",
            "--reason",
            "ready for review",
        )


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_1_with_a_single_line_on_stderr(tmp_path):
    """The real manage.py process, against the test database."""
    path = tmp_path / "bad.toml"
    path.write_text(policy_toml(retention='"0 days"'))
    params = connection.get_connection_params()
    url = f"postgresql:///{params['dbname']}?host={params['host']}&user={params['user']}"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DATABASE_URL": url, "RETENTION_DEMO": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "retention",
            "policy",
            "apply",
            str(path),
            "--author",
            "x",
            "--reason",
            "ready for review",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "CommandError: line 7: retention must be longer than zero, got '0 days'; when the"
        " timestamp is"
        " an expiry time (a row may go once it has passed), set timestamp_is_expiry = true"
    ]
    assert Policy.objects.count() == 0


def test_policy_list_shows_each_policy_with_its_state(events_table, alice, write_policy):
    run_cli("policy", "apply", write_policy(), "--author", "alice", "--reason", "ready for review")

    out = run_cli("policy", "list")

    assert (
        out.strip()
        == "events  not approved  latest v1 submitted  enabled  '0 3 * * *' Europe/Berlin"
    )
