"""``manage.py check --deploy`` is clean with production settings (and the check is live)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from tests import zygote
from tests.runs.conftest import ROOT


def deploy_check(**overrides: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECURE_", "SESSION_", "CSRF_"))
        # DJANGO_ALLOW_ASYNC_UNSAFE is set by the browser tests for Playwright in this process
        # RETENTION_TEST_MD5_PASSWORDS: the suite's own hashing (tests/conftest.py), core.W002
        and k
        not in (
            "RETENTION_DEMO",
            "DEBUG",
            "DJANGO_ALLOW_ASYNC_UNSAFE",
            "RETENTION_TEST_MD5_PASSWORDS",
        )
    }
    env.update(
        SECRET_KEY=secrets.token_urlsafe(64),
        DEBUG="0",
        ALLOWED_HOSTS="retention.example.com",
        DATABASE_URL="postgresql://retention@db.example.com:5432/retention",
    )
    env.update(overrides)
    return zygote.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip


def test_production_settings_pass_the_deploy_check():
    result = deploy_check()
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_the_deploy_check_fails_when_https_is_turned_off():
    result = deploy_check(SECURE_SSL_REDIRECT="0", SECURE_HSTS_SECONDS="0", SECURE_COOKIES="0")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr
