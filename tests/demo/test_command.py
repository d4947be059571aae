"""``manage.py demo``: options, output, idempotence and its refusal outside demo mode."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command


def _demo(*args: str) -> str:
    out = StringIO()
    call_command("demo", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_it_reports_rows_written_then_finds_them_present(transactional_db):
    first = _demo("--rows", "20000", "--seed", "5", "--tenants", "20", "--no-users", "-v", "0")
    assert "rows written" in first and "rows/s" in first
    assert "marketplace_events 20,000" in first and "tenants 20" in first
    second = _demo("--rows", "20000", "--seed", "5", "--tenants", "20", "--no-users")
    assert "demo data already present" in second
    assert not User.objects.exists()


def test_it_creates_the_demo_users_unless_told_not_to(transactional_db):
    out = _demo("--rows", "20000")
    assert "demo users created: alice, carol, oscar, audrey, victor, admin" in out
    assert "demo users already present" in _demo("--rows", "20000")
    assert User.objects.filter(username__in=["alice", "carol", "admin"]).count() == 3


def test_it_refuses_public_passwords_outside_demo_mode(transactional_db, settings, monkeypatch):
    monkeypatch.setenv("RETENTION_DEMO", "0")
    settings.DEBUG = False
    with pytest.raises(CommandError, match="RETENTION_DEMO=1"):
        _demo("--rows", "20000")
    assert not User.objects.exists()


def test_it_rejects_too_few_rows(transactional_db):
    with pytest.raises(CommandError, match="rows must be at least 1000"):
        _demo("--rows", "10", "--no-users")
