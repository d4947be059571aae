#!/usr/bin/env python
"""API benchmark: latency of the HTTP API under gunicorn, and the command line both ways.

    RETENTION_DEMO=1 .venv/bin/python bench/api.py [--rows 200000] [--requests 50] [--keep]

Builds a throwaway database (``bench_api``, dropped at the end unless --keep): a 200k-row
events table with an approved policy, a planned run and a hold, and one token per role. Starts
gunicorn (2 workers) on a loopback port against it and times, with keep-alive off as a
script's calls are: reads (run status, policy list, hold list), decisions (pause and resume
alternating, each with its operator-log row), and whole commands — ``retention status`` as the
API client and ``manage.py retention status`` with the database — as separate processes.

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("RETENTION_DEMO", "1")
os.environ["TEST_DATABASE_NAME"] = "bench_api"

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402


def build(rows: int) -> dict:
    from django.contrib.auth.models import Group, User

    from core.tokens import create_token
    from retention import actions
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    def make_user(name: str, *roles: str):
        user = User.objects.create_user(username=name, password=f"{name}-pw")
        for role in roles:
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        return user

    create_events(rows)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    officer = User.objects.get(username="author-events")
    actions.place_hold(actor=officer, reason="LIT-1", policy=policy, tenant="3")
    oncall = make_user("oscar", "oncall")
    return {"run": run.run_key, "token": create_token(oncall, name="bench")[1]}


def database_url() -> str:
    from tests.runs.conftest import worker_env

    return worker_env()["DATABASE_URL"]


def timed(n: int, call) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    print("» creating the throwaway database bench_api", flush=True)
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    gunicorn = None
    try:
        world = build(args.rows)
        from tests.api.live import free_port

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, DATABASE_URL=database_url(), DEBUG="0", DB_CONN_MAX_AGE="60",
                   API_THROTTLE_RATE="100000/m")  # fmt: skip
        gunicorn = subprocess.Popen(
            [str(Path(sys.executable).with_name("gunicorn")), "config.wsgi", "--bind",
             f"127.0.0.1:{port}", "--workers", "2"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=5).read()
                break
            except OSError:
                time.sleep(0.2)
        key, token = world["run"], world["token"]

        def call(method: str, path: str, body: dict | None = None):
            request = urllib.request.Request(
                f"{url}/api/v1{path}", method=method,
                data=json.dumps(body).encode() if body is not None else None,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.read()

        n = args.requests
        call("GET", f"/runs/{key}")  # warm both workers' connections
        call("GET", f"/runs/{key}")
        rows = [
            ("GET /runs/KEY (status)", timed(n, lambda i: call("GET", f"/runs/{key}"))),
            ("GET /policies", timed(n, lambda i: call("GET", "/policies"))),
            ("GET /holds (coverage counted)", timed(n, lambda i: call("GET", "/holds"))),
            ("POST /runs/KEY/pause|resume", timed(n, lambda i: call(
                "POST", f"/runs/{key}/{'resume' if i % 2 else 'pause'}", {"reason": "bench"}))),
        ]  # fmt: skip
        client_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "DJANGO"))
        }
        client_env.update(RETENTION_URL=url, RETENTION_TOKEN=token, PYTHONPATH=str(ROOT / "client"))
        rows.append(("process: retention status (API client)", timed(10, lambda i: subprocess.run(
            [sys.executable, "-m", "retention_client", "status", key], env=client_env, cwd="/",
            capture_output=True, check=True))))  # fmt: skip
        db_env = dict(os.environ, DATABASE_URL=database_url(), RETENTION_TOKEN=token)
        rows.append(("process: manage.py retention status", timed(10, lambda i: subprocess.run(
            [sys.executable, "manage.py", "retention", "status", key], env=db_env, cwd=ROOT,
            capture_output=True, check=True))))  # fmt: skip
        print()
        print(
            f"{'call (' + str(args.rows) + ' rows)':42} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}"
        )
        for name, times in rows:
            times = sorted(times)
            p95 = times[max(0, round(0.95 * len(times)) - 1)]
            print(
                f"{name:42} {len(times):4} {statistics.median(times):9.1f} {p95:9.1f} {times[-1]:9.1f}"
            )
    finally:
        if gunicorn is not None:
            gunicorn.terminate()
            gunicorn.wait(30)
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
