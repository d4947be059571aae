"""The client package alone: a fresh virtualenv (``python3 -m venv``) with nothing but
``client/`` installed — no Django, no database driver — runs ``retention status RUN_KEY``
against a live server with only ``RETENTION_URL`` and a token."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from core.tokens import create_token
from runs.actions import cancel_run, trigger_run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

from .live import ROOT, client_env, gunicorn, with_database

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_fresh_virtualenv_with_only_the_client_reads_a_run(make_user, tmp_path):
    create_events(600)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    oncall = make_user("oscar", "oncall")
    cancel_run(run, actor=oncall, reason="a finished run prints the same twice")
    _, token = create_token(make_user("vera", "viewer"), name="laptop")

    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
    source = shutil.copytree(ROOT / "client", tmp_path / "client")  # the build writes nothing here
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index", str(source)],
        check=True, timeout=300,
    )  # fmt: skip
    python = str(venv / "bin" / "python")
    for module in ("django", "psycopg"):
        found = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
        assert found.returncode == 1, f"{module} is importable in the client's virtualenv"

    with gunicorn() as url:
        result = subprocess.run(
            [str(venv / "bin" / "retention"), "status", run.run_key], cwd=tmp_path,
            env=client_env(url, token), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"run_key                    {run.run_key}\n")
        assert "state                      cancelled\n" in result.stdout
        assert result.stdout == with_database(("status", run.run_key), token=token).stdout
