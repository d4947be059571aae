"""A live server for the command line to talk to: gunicorn on a loopback port against the
test database, and the two ways of running a command — ``manage.py retention`` with the
database, and the API client (``retention_client``) with only a URL and a token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tests import zygote
from tests.runs.conftest import worker_env

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gunicorn(database_url: str | None = None):
    """``http://127.0.0.1:PORT`` served by gunicorn (two workers) until the block ends
    (``database_url``: connecting with another login than the test database's owner)."""
    port = free_port()
    env = dict(os.environ, **worker_env(), DB_CONN_MAX_AGE="0")
    if database_url:
        env["DATABASE_URL"] = database_url
    process = subprocess.Popen(
        [str(GUNICORN), "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2",
         "--timeout", "120"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=5).read()
                break
            except urllib.error.HTTPError:
                break  # it answers (503: not every cluster is up, which the API does not need)
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not start: {process.stderr.read()}") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def with_database(args, *, token: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``manage.py retention ARGS`` against the test database, acting with ``token``: a
    process of its own, forked from a zygote that set Django up with the same configuration
    (tests/zygote.py), so each command pays for its own work, not for Django's start."""
    env = dict(os.environ, **worker_env(), RETENTION_TOKEN=token)
    return zygote.run(
        [sys.executable, "manage.py", "retention", *args], cwd=ROOT, env=env, input=stdin,
        timeout=300, django=True,
    )  # fmt: skip


def client_env(url: str, token: str) -> dict:
    """Only the URL and the token: no database address, no Django settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "PG", "DJANGO"))}
    env.update(RETENTION_URL=url, RETENTION_TOKEN=token)
    env.pop("RETENTION_DEMO", None)
    return env


def with_api(args, *, url: str, token: str, stdin: str | None = None,
             python: str = sys.executable) -> subprocess.CompletedProcess:  # fmt: skip
    """``retention ARGS`` as the API client, started so that it cannot import the project: its
    package alone on the path, in an empty working directory."""
    env = client_env(url, token)
    env["PYTHONPATH"] = str(ROOT / "client")
    return subprocess.run(
        [python, "-B", "-m", "retention_client", *args], cwd="/",
        env=env, input=stdin, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
