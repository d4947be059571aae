"""Bad configuration stops start-up with one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

ROOT = Path(__file__).resolve().parents[2]


def run_check(**env_overrides: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"SECRET_KEY", "RETENTION_DEMO", "DEBUG", "RETENTION_TEST_MD5_PASSWORDS"}
    }
    env.update(env_overrides)
    return zygote.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
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
        ({"RETENTION_EVIDENCE_KEY": "short", "SECRET_KEY": "k"}, "RETENTION_EVIDENCE_KEY"),
        (
            {"RETENTION_EVIDENCE_KEY_FILE": "/nonexistent/key", "SECRET_KEY": "k"},
            "RETENTION_EVIDENCE_KEY_FILE",
        ),
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


SECRET = "hunter2-not-for-your-eyes"


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://root:{SECRET}@localhost/x",
        f"postgresql://u:{SECRET}@h:notaport/db",
        f"postgresql://u:{SECRET}@h/",
        f"postgresql://u:{SECRET}@h/db?nosuchoption=1",
        f"postgresql://u@h:notaport/db?password={SECRET}",
        f"postgresql://u@h/?sslmode=require&password={SECRET}",
    ],
)
def test_a_bad_database_url_is_named_without_its_password(url):
    result = run_check(DATABASE_URL=url, SECRET_KEY="k")
    assert result.returncode == 2
    assert result.stderr.startswith("configuration error: DATABASE_URL")
    assert SECRET not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://retention@db.example.com:5432/retention",
        "postgresql://retention@10.0.0.7/retention",
        "postgresql://retention@127.0.0.1,db.example.com/retention",
        "postgresql://retention@/retention?host=db.example.com",
        "postgresql://retention@localhost/retention?hostaddr=10.0.0.7",
    ],
)
def test_demo_mode_refuses_a_database_that_is_not_local(url):
    result = run_check(DATABASE_URL=url, RETENTION_DEMO="1", DEBUG="0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("configuration error: RETENTION_DEMO=1")
    for weakened in ("public demo SECRET_KEY", "Secure", "HTTPS"):
        assert weakened in lines[0]


REMOTE_SERVICE = "[prod]\nhost=db.example.com\nport=5432\n"


@pytest.mark.parametrize(
    ("url", "env", "service_file"),
    [
        ("postgresql:///retention?service=prod", {}, REMOTE_SERVICE),
        ("postgresql:///retention", {"PGSERVICE": "prod"}, REMOTE_SERVICE),
        ("postgresql://localhost/retention?service=prod", {}, "[prod]\nhostaddr=10.0.0.7\n"),
        ("postgresql:///retention?service=prod", {}, "[prod]\nhost=localhost\nhostaddr=10.0.0.7\n"),
        ("postgresql:///retention", {"PGHOST": "db.example.com"}, None),
        ("postgresql:///retention", {"PGHOSTADDR": "10.0.0.7"}, None),
    ],
    ids=["service in the url", "PGSERVICE", "hostaddr beside a local host", "service hostaddr",
         "PGHOST", "PGHOSTADDR"],
)  # fmt: skip
def test_demo_mode_checks_where_a_service_or_the_environment_sends_the_connection(
    tmp_path, url, env, service_file
):
    """What libpq would connect to decides: a service (in the URL or PGSERVICE) from the
    service file, and PGHOST/PGHOSTADDR, not only the URL's own host."""
    if service_file is not None:
        (tmp_path / "pg_service.conf").write_text(service_file)
        env = {**env, "PGSERVICEFILE": str(tmp_path / "pg_service.conf")}
    result = run_check(DATABASE_URL=url, RETENTION_DEMO="1", DEBUG="0", **env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("configuration error: RETENTION_DEMO=1"), result.stderr
    assert "10.0.0.7" in result.stderr or "db.example.com" in result.stderr


def test_demo_mode_starts_on_a_service_that_is_this_machine(tmp_path):
    (tmp_path / "pg_service.conf").write_text("[mine]\nhost=/tmp/sockets\n")
    result = run_check(
        DATABASE_URL="postgresql:///retention?service=mine",
        RETENTION_DEMO="1",
        DEBUG="0",
        PGSERVICEFILE=str(tmp_path / "pg_service.conf"),
    )
    assert result.returncode == 0, result.stderr
    assert "core.W001" in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgresql://postgres@localhost/test",
        "postgresql://postgres@[::1]/test",
        "postgresql://postgres@/test?host=/tmp/sockets",
    ],
)
def test_demo_mode_on_a_local_database_starts_and_says_what_it_weakens(url):
    result = run_check(DATABASE_URL=url, RETENTION_DEMO="1", DEBUG="0")
    assert result.returncode == 0, result.stderr
    assert "core.W001" in result.stderr
    for weakened in ("public demo SECRET_KEY", "without Secure", "no HTTPS redirect"):
        assert weakened in result.stderr


def test_production_settings_have_no_demo_warning():
    result = run_check(SECRET_KEY="a-real-secret-for-this-test", DEBUG="0")
    assert "core.W001" not in result.stderr + result.stdout


def test_error_reports_hide_connection_urls_from_the_environment(settings):
    from django.test import RequestFactory
    from django.views.debug import get_default_exception_reporter_filter

    request = RequestFactory().get("/", DATABASE_URL=f"postgresql://u:{SECRET}@h/db")
    request.META["REDIS_URL"] = f"redis://:{SECRET}@cache:6379/0"
    meta = get_default_exception_reporter_filter().get_safe_request_meta(request)
    assert SECRET not in repr(meta)
    assert meta["DATABASE_URL"] != request.META["DATABASE_URL"]


def test_passwords_are_hashed_with_pbkdf2_unless_the_suite_says_otherwise_and_check_warns():
    """The suite hashes its throwaway passwords with MD5 (tests/conftest.py); the product's own
    setting is PBKDF2, and a process where the suite's variable is set says so at its check."""
    show = "from django.contrib.auth.hashers import make_password; print(make_password('pw'))"
    env = {k: v for k, v in os.environ.items() if k != "RETENTION_TEST_MD5_PASSWORDS"}
    product = zygote.run(
        [sys.executable, "manage.py", "shell", "-c", show], cwd=ROOT, env=env, timeout=120
    )
    assert product.returncode == 0, product.stderr
    assert product.stdout.splitlines()[-1].startswith("pbkdf2_sha256$"), product.stdout
    assert "core.W002" not in run_check(SECRET_KEY="a-real-secret-for-this-test").stderr

    suite = run_check(SECRET_KEY="a-real-secret-for-this-test", RETENTION_TEST_MD5_PASSWORDS="1")
    assert suite.returncode == 0, suite.stderr
    assert "core.W002" in suite.stderr and "MD5" in suite.stderr
