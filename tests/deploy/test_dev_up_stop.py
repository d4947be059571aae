"""Ctrl-C of `dev.py up` while a run drains: web, both clusters and the embedded PostgreSQL
stop, no lease starts another chunk, and every run's invariants hold afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from tests import zygote
from tests.deploy.install import free_port, wait_for

pytestmark = [pytest.mark.processes]
ROOT = Path(__file__).resolve().parents[2]
CLEANUP_WORKERS, DEADLINE_WORKERS = 2, 1


def _env(pgdata: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "TEST_DATABASE_NAME"} and not k.startswith("RETENTION_")
    }
    env.update(RR_PGDATA=str(pgdata), RETENTION_DEMO="1", DEBUG="0",
               CLEANUP_WORKERS=str(CLEANUP_WORKERS), DEADLINE_WORKERS=str(DEADLINE_WORKERS))  # fmt: skip
    return env


def _python(env: dict, code: str) -> str:
    result = zygote.run([sys.executable, "-c", code], cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment or command line names ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(entry.name))
    return found


def test_ctrl_c_of_dev_up_while_a_run_drains_stops_everything_and_invariants_hold():
    pgdata = Path("/tmp") / f"rr-devup-{uuid.uuid4().hex[:10]}"
    env = _env(pgdata)
    log = open(pgdata.with_suffix(".log"), "w")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "dev.py", "up", "--rows", "300000", "--port", str(free_port())],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: "Retention Runner is up" in pgdata.with_suffix(".log").read_text(),
            timeout=300,
            what="dev.py up to start",
        )
        url = _python(env, "from core import embedded_pg; print(embedded_pg.database_url())")

        def audited() -> int:
            try:
                with psycopg.connect(url, connect_timeout=3) as conn:
                    return conn.execute(
                        "SELECT count(*) FROM retention_runner.runs_auditrecord"
                    ).fetchone()[0]
            except psycopg.Error:
                return 0

        first = wait_for(audited, timeout=300, what="a run to start draining")
        wait_for(lambda: audited() > first + 2, timeout=120, what="the run to keep draining")
        with psycopg.connect(url) as conn:
            active = conn.execute(
                "SELECT count(*) FROM retention_runner.runs_run WHERE state = 'active'"
            ).fetchone()
        assert active[0] >= 1  # Ctrl-C comes while a run drains
        interrupted_at = datetime.now(UTC)
        t0 = time.monotonic()
        os.killpg(up.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        up.wait(timeout=120)
        stopped_after = time.monotonic() - t0
        print(f"\ndev.py up stopped {stopped_after:.1f} s after Ctrl-C")
        assert up.returncode == 0
        assert _processes_with(str(pgdata)) == []  # web, clusters, their children, PostgreSQL
        assert not (pgdata / "postmaster.pid").exists()

        # the database again, to check what the stop left behind
        url = _python(env, "from core import embedded_pg; print(embedded_pg.database_url())")
        with psycopg.connect(url) as conn:
            late = conn.execute(
                "SELECT count(*) FROM retention_runner.runs_auditrecord WHERE started_at > %s",
                [interrupted_at],
            ).fetchone()[0]
            run_keys = [
                r[0]
                for r in conn.execute("SELECT run_key FROM retention_runner.runs_run").fetchall()
            ]
        print(f"chunks started after Ctrl-C: {late}")
        # at most the chunk each worker (of both clusters) had in flight; no lease starts another
        assert late <= CLEANUP_WORKERS + DEADLINE_WORKERS, f"{late} chunks started after Ctrl-C"
        for key in run_keys:
            result = zygote.run(
                [sys.executable, "manage.py", "retention", "check", key],
                cwd=ROOT, env=env, timeout=120,
            )  # fmt: skip
            assert result.returncode == 0 and "every invariant holds" in result.stdout, (
                key,
                result.stdout,
                result.stderr,
            )
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()
        _python(env, "from core import embedded_pg; embedded_pg.stop()")
        shutil.rmtree(pgdata, ignore_errors=True)
        pgdata.with_suffix(".log").unlink(missing_ok=True)
