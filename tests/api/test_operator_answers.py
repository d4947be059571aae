"""What the command line and the API say to an operator: a trigger that finds the period's
run says so and of which version; a kill switch already on says "already"; status prints no
Python reprs; the CSV export answers an unknown run with the documented JSON error; a stale
decision over the API speaks of the ETag, not of a page; a version and the approved ones as
policy files."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from core.models import OperatorAction
from runs.actions import set_kill_switch

pytestmark = pytest.mark.django_db


def retention(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("retention", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_trigger_that_finds_the_periods_run_says_so_and_of_which_version(world, act_as, people):
    act_as(people["oncall"])
    first, err = retention("trigger", "events", "--period", "2026-11-29")
    assert err == ""
    out, err = retention("trigger", "events", "--period", "2026-11-29")
    assert out == first
    assert "already exists: the run of this period, v1, " in err


def test_the_kill_switch_turned_on_twice_says_already(world, act_as, people):
    act_as(people["oncall"])
    assert retention("kill-switch", "on", "--reason", "INC-1")[0].strip() == "kill switch on"
    out, _ = retention("kill-switch", "on", "--reason", "INC-1 again")
    assert out.startswith("kill switch already on (turned on by oscar: “INC-1”)")
    assert OperatorAction.objects.filter(action="kill_switch.on").count() == 1


def test_status_prints_no_python_reprs(world):
    out, _ = retention("status", world["run"].run_key)
    assert "{" not in out and "None" not in out and "[" not in out
    assert "chunks" in out and "pending" in out


def test_the_csv_export_answers_an_unknown_run_with_the_json_error(api, world):
    status, body = api.get("/audit/export.csv?run=no-such-run", as_="auditor")
    assert status == 404
    assert body == {"code": "not_found", "message": "run: no run with id or key 'no-such-run'"}


def test_a_stale_decision_over_the_api_speaks_of_the_etag(api, world, people):
    status, switch = api.get("/kill-switch", as_="viewer")
    etag = api.last["ETag"]
    set_kill_switch(True, actor=people["oncall"], reason="INC-2")
    status, body = api.post("/kill-switch", {"state": "off", "reason": "over"}, as_="oncall",
                            headers={"If-Match": etag})  # fmt: skip
    assert status == 412 and body["code"] == "stale_state"
    assert "page" not in body["message"] and "If-Match" in body["message"]


def test_a_version_as_a_policy_file_both_ways(api, world):
    out, _ = retention("policy", "show", "events", "--version", "2", "--toml")
    assert 'retention = "25 days"' in out and not out.startswith("#")
    status, body = api.get("/policies/events/file?version=2&toml=true", as_="viewer")
    assert status == 200 and body["stdout"] == out
    status, body = api.post("/policy-files/pull", {"dir": "policies", "files": []}, as_="viewer")
    assert status == 200
    assert [f["name"] for f in body["files"]] == ["events.toml"]
    assert body["output"]["stdout"] == "policies/events.toml: written (events approved v1)\n"
    status, body = api.get("/policies/evnets/file", as_="viewer")
    assert status == 400 and "did you mean 'events'" in body["message"]


def test_evidence_writes_the_runs_csv_and_manifest(world, act_as, people, tmp_path):
    import json as _json

    from runs.engine import worker

    act_as(people["auditor"])
    run = world["run"]
    worker.process_one(run)
    csv_path, manifest_path = tmp_path / "run.csv", tmp_path / "run.json"
    out, _ = retention(
        "evidence", run.run_key, "--csv", str(csv_path), "--manifest", str(manifest_path)
    )
    lines = csv_path.read_bytes().count(b"\n") - 1
    assert out == (
        f"{csv_path}: the audit CSV of {run.run_key}, {lines:,} line(s)\n"
        f"{manifest_path}: the evidence manifest of {run.run_key}\n"
    )
    assert lines >= 1 and csv_path.read_text().startswith("chain_seq,")
    assert _json.loads(manifest_path.read_text())["run"]["run_key"] == run.run_key
