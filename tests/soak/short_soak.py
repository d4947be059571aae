"""The chaos soak in its short mode (bench/soak.py) as a test runs it: one process, its own
embedded PostgreSQL server in a fresh data directory (restarting it never touches the
database other tests use), its report read back from JSON.

Each short soak has a test file of its own, so test processes that take whole files
(``--dist loadfile``) run them side by side instead of one after the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.runs.conftest import ROOT

on_its_own_server = pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="the soak always runs on its own embedded server; it runs in the embedded pass",
)


def short_soak(tmp_path, *args: str) -> dict:
    """bench/soak.py with ``args``; its report, printed, once the report says no problem
    and the soak exited 0."""
    report_path = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RR_PGDATA")}
    result = subprocess.run(
        [sys.executable, "bench/soak.py", *args, "--json", str(report_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert report_path.exists(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(report["table"])
    assert report["problems"] == [], report["table"]
    assert result.returncode == 0, result.stderr[-3000:]
    return report
