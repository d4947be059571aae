#!/usr/bin/env python3
"""Set up and run Retention Runner with nothing but Python 3.11+.

    python3 dev.py up      # dashboard + cleanup workers + scheduler on embedded PostgreSQL, with the demo
    python3 dev.py test    # the whole test suite

Both create (or refresh) a virtual environment in .venv first.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STOP_GRACE_S = 7  # then SIGKILL; with the database's stop, `up` ends within 10 s of Ctrl-C
FLEET_PGDATA = ROOT / ".pgdata-fleet" / "demo-second"  # `up --fleet`: the second target's server
FLEET_DSN_ENV = "RETENTION_DEMO_SECOND_DSN"


def ensure_venv() -> None:
    """Create .venv and install the pinned dependencies when pyproject.toml changed."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".deps-{digest}"
    if stamp.exists():
        return
    if not PY.exists():
        print("» creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("» installing dependencies (once; pyproject.toml changed or first run)", flush=True)
    subprocess.run(
        [
            str(PY),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "-e",
            f"{ROOT}[test]",
        ],
        check=True,
    )
    for old in VENV.glob(".deps-*"):
        old.unlink()
    stamp.touch()


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def manage(*args: str, env: dict | None = None) -> None:
    result = subprocess.run([str(PY), str(ROOT / "manage.py"), *args], env=env, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(result.returncode)


def up(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="dev.py up")
    parser.add_argument("--rows", type=int, default=int(os.environ.get("DEMO_ROWS", "1000000")))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="a second embedded PostgreSQL as a second target (the fleet view; docs/fleet.md)",
    )
    args = parser.parse_args(argv)

    env = dict(os.environ)
    env.setdefault("RETENTION_DEMO", "1")
    env.setdefault("DEBUG", "0")
    manage("migrate", "--no-input", "-v", "0", env=env)
    demo = ["demo", "--rows", str(args.rows)]
    if args.fleet:
        # the second server: its own data directory, a Unix socket of its own
        second = subprocess.run(
            [str(PY), "-c", "from core import embedded_pg; print(embedded_pg.database_url())"],
            env=dict(env, RR_PGDATA=str(FLEET_PGDATA)), cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        env[FLEET_DSN_ENV] = second
        second_env = dict(env, DATABASE_URL=second)
        manage("migrate", "--no-input", "-v", "0", env=second_env)  # the ledger
        manage("demo", "--rows", str(args.rows // 2), "--no-users", env=second_env)
        demo += ["--fleet-dsn-env", FLEET_DSN_ENV]
    manage(*demo, env=env)
    manage("collectstatic", "--no-input", "-v", "0", env=env)
    manage("retention", "startup", env=env)

    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, cmd: list[str], extra: dict | None = None) -> None:
        proc_env = dict(env, **(extra or {}))
        procs.append((name, subprocess.Popen(cmd, env=proc_env, cwd=ROOT, start_new_session=True)))

    start(
        "web",
        [str(PY), "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload", "--insecure"],
    )
    start("cleanup", [str(PY), "manage.py", "qcluster"], {"Q_CLUSTER_NAME": "cleanup"})
    start("deadline", [str(PY), "manage.py", "qcluster"], {"Q_CLUSTER_NAME": "deadline"})

    print(
        f"\nRetention Runner is up: http://127.0.0.1:{args.port}/\n"
        "Demo logins (password = username + '-demo'):\n"
        "  compliance: alice, carol   oncall: oscar   auditor: audrey   viewer: victor\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    import threading

    stopping = threading.Event()  # set by Ctrl-C / SIGTERM; wakes the loop at once
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.is_set():
            for name, proc in procs:
                if proc.poll() is not None:
                    print(f"» {name} exited with {proc.returncode}; stopping", flush=True)
                    stopping.set()
            stopping.wait(0.5)
    finally:
        stop_started = time.monotonic()
        print("» stopping web and workers (each lease ends at its next chunk)", flush=True)
        for _, proc in procs:
            if proc.poll() is None:
                # the main PID only: qcluster shuts down gracefully
                proc.send_signal(signal.SIGTERM)
        # A lease ends at its next chunk boundary, so a cluster stops in seconds; whatever
        # is still running after the grace period is killed, which the engine survives
        # (an uncommitted chunk stays pending, an unacknowledged message is redelivered).
        deadline = time.monotonic() + STOP_GRACE_S
        for name, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"» {name} still running after {STOP_GRACE_S} s: killed", flush=True)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # any child left behind
            except ProcessLookupError:
                pass
            proc.wait()
        if not env.get("DATABASE_URL"):
            print("» stopping embedded PostgreSQL", flush=True)
            subprocess.run(
                [str(PY), "-c", "from core import embedded_pg; embedded_pg.stop()"],
                cwd=ROOT,
                check=False,
            )
        if args.fleet:
            subprocess.run(
                [str(PY), "-c", "from core import embedded_pg; embedded_pg.stop()"],
                env=dict(env, RR_PGDATA=str(FLEET_PGDATA)), cwd=ROOT, check=False,
            )  # fmt: skip
        print(f"» stopped in {time.monotonic() - stop_started:.1f} s", flush=True)


def test_processes() -> int:
    """Test processes side by side: one more than the cores (many tests wait on worker
    processes, sockets and timeouts), at most four; ``RETENTION_TEST_PROCESSES`` overrides."""
    chosen = os.environ.get("RETENTION_TEST_PROCESSES")
    if chosen:
        return int(chosen)
    return min(4, (os.cpu_count() or 1) + 1)


def test(argv: list[str]) -> None:
    env = dict(os.environ)
    env.setdefault("RETENTION_DEMO", "1")
    # Every Python the suite starts (each test process, CLI, worker, gunicorn) imports the same
    # few hundred modules: where bytecode is not written (PYTHONDONTWRITEBYTECODE, as on this
    # machine) each compiled them again, 9 s of CPU a test process for its collection alone
    # and 0.3 s a command. Written instead: the installed packages' bytecode is the one pip
    # compiled as it installed them, the project's lands in its __pycache__ folders (ignored).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # each test file runs whole in one process (its module fixtures built once), each process
    # on its own test database of the same server; `-n 0` runs everything in this process
    if not any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in argv):
        argv = ["-n", str(test_processes()), "--dist", "loadfile", *argv]
    result = subprocess.run([str(PY), "-m", "pytest", *argv], cwd=ROOT, env=env)
    sys.exit(result.returncode)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in {"up", "test"}:
        print(__doc__)
        sys.exit(2)
    ensure_venv()
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "up":
        up(rest)
    else:
        test(rest)


if __name__ == "__main__":
    main()
