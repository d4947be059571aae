"""How long Ctrl-C of ``dev.py up`` takes while a run drains; prints a table.

    .venv/bin/python bench/shutdown.py [--tries 3] [--rows 300000]

Each try starts ``dev.py up`` on its own embedded PostgreSQL (a temporary data directory,
never the dev or test server), waits until a demo run has committed chunks and keeps
committing, sends SIGINT to its process group (what a terminal's Ctrl-C does), and
measures until ``dev.py`` has exited — web, both clusters and PostgreSQL stopped. It also
counts the chunks that started after the interrupt. The test
``tests/deploy/test_dev_up_stop.py`` checks the same stop without timing it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def _python(env: dict, code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return out.stdout.strip()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_try(rows: int) -> dict:
    pgdata = Path("/tmp") / f"rr-bench-stop-{uuid.uuid4().hex[:10]}"
    logfile = pgdata.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RR_PGDATA=str(pgdata), RETENTION_DEMO="1", DEBUG="0")
    with open(logfile, "w") as log:
        up = subprocess.Popen(
            [sys.executable, "dev.py", "up", "--rows", str(rows), "--port", str(_port())],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        while "Retention Runner is up" not in logfile.read_text():
            if up.poll() is not None:
                raise SystemExit(f"dev.py up exited early; see {logfile}")
            time.sleep(0.5)
        url = _python(env, "from core import embedded_pg; print(embedded_pg.database_url())")

        def audited() -> int:
            with psycopg.connect(url) as conn:
                return conn.execute(
                    "SELECT count(*) FROM retention_runner.runs_auditrecord"
                ).fetchone()[0]

        while audited() == 0:
            time.sleep(0.3)
        first = audited()
        while audited() < first + 3:
            time.sleep(0.3)
        interrupted_at = datetime.now(UTC)
        t0 = time.monotonic()
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=120)
        seconds = time.monotonic() - t0
        url = _python(env, "from core import embedded_pg; print(embedded_pg.database_url())")
        with psycopg.connect(url) as conn:
            late = conn.execute(
                "SELECT count(*) FROM retention_runner.runs_auditrecord WHERE started_at > %s",
                [interrupted_at],
            ).fetchone()[0]
            active = conn.execute(
                "SELECT count(*) FROM retention_runner.runs_run WHERE state = 'active'"
            ).fetchone()[0]
        return {"seconds": seconds, "late_chunks": late, "active_runs": active}
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        subprocess.run([sys.executable, "-c", "from core import embedded_pg; embedded_pg.stop()"],
                       cwd=ROOT, env=env, capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(pgdata, ignore_errors=True)
        logfile.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--rows", type=int, default=300_000)
    args = parser.parse_args()
    results = [one_try(args.rows) for _ in range(args.tries)]
    print("| try | Ctrl-C → everything stopped | chunks started after Ctrl-C | runs still active |")
    print("|---|---|---|---|")
    for i, r in enumerate(results, 1):
        print(f"| {i} | {r['seconds']:.1f} s | {r['late_chunks']} | {r['active_runs']} |")
    worst = max(r["seconds"] for r in results)
    print(f"\nworst of {len(results)}: {worst:.1f} s (target ≤ 10 s)")


if __name__ == "__main__":
    main()
