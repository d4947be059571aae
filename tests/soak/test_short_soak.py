"""The chaos soak in its short mode (bench/soak.py): real cleanup clusters and drain processes
drain a run while a driver kills workers, terminates their backends, locks the table, places
and releases holds, supersedes the policy, fires duplicate triggers, pauses, flips the kill
switch and restarts PostgreSQL. The run must converge and every invariant must hold.

The soak starts its own embedded PostgreSQL server in a fresh data directory, so restarting
it never touches the database other tests use."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.runs.conftest import ROOT

pytestmark = pytest.mark.processes

FAULT_PHASE_S = 90  # + about 15 s of setup and up to 60 s to converge: under 3 minutes


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="the soak always runs on its own embedded server; it runs in the embedded pass",
)
def test_a_run_under_chaos_converges_and_every_invariant_holds(tmp_path):
    report_path = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RR_PGDATA")}
    result = subprocess.run(
        [
            sys.executable, "bench/soak.py", "--seconds", str(FAULT_PHASE_S),
            "--converge-seconds", "60", "--json", str(report_path),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert report_path.exists(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(report["table"])
    assert report["problems"] == [], report["table"]
    assert result.returncode == 0, result.stderr[-3000:]
    [epoch] = report["epochs"]
    assert epoch["converged"]
    assert "drained" in epoch["runs"].values()
    assert report["rows_deleted"] > 0
    assert report["invariant_checks_passed"] >= 2
    injected = {row["fault"]: row["injected"] for row in report["faults"]}
    assert injected["pg_restart"] == 1
    for kind in ("sigkill_qcluster", "terminate_backend", "lock_table", "legal_hold"):
        assert injected[kind] > 0, kind
    assert report["survived"] == report["injected"], report["table"]
    assert report["stuck_messages"] == 0 and report["idle_in_transaction"] == 0


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="the soak always runs on its own embedded server; it runs in the embedded pass",
)
def test_a_partitioned_table_under_chaos_drops_whole_partitions_and_every_invariant_holds(
    tmp_path,
):
    report_path = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RR_PGDATA")}
    result = subprocess.run(
        [
            sys.executable, "bench/soak.py", "--seconds", "60", "--converge-seconds", "60",
            "--partitioned", "--json", str(report_path),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert report_path.exists(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(report["table"])
    assert report["problems"] == [], report["table"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["partitions_dropped"] > 0
    [epoch] = report["epochs"]
    assert epoch["converged"] and "drained" in epoch["runs"].values()
    assert report["invariant_checks_passed"] >= 2
