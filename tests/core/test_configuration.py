"""Bad configuration stops start-up with one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_check(**env_overrides: str) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "RETENTION_DEMO", "DEBUG"}
    }
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"DATABASE_URL": "mysql://root@localhost/x", "SECRET_KEY": "k"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql://u@h:notaport/db", "SECRET_KEY": "k"}, "DATABASE_URL"),
        ({"CLEANUP_WORKERS": "two", "SECRET_KEY": "k"}, "CLEANUP_WORKERS"),
        ({"DEBUG": "0"}, "SECRET_KEY"),
        ({"DEBUG": "maybe", "SECRET_KEY": "k"}, "DEBUG"),
    ],
)
def test_bad_configuration_stops_with_one_line_naming_the_variable(overrides, variable):
    result = run_check(**overrides)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("configuration error:")
    assert variable in lines[0]
    assert "Traceback" not in result.stderr


def test_good_configuration_passes_the_system_check():
    result = run_check(SECRET_KEY="a-real-secret-for-this-test", DEBUG="0")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
