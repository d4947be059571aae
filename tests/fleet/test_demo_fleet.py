"""``dev.py up --fleet``'s step: ``manage.py demo --fleet-dsn-env VAR`` registers the second
database as the target ``second`` and approves the marketplace events policy over it; its run
drains there, and the overview shows the fleet line."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from demo.marketplace import DemoParams, ensure_marketplace
from targets import connections as C
from targets.models import Target
from tests.fleet.conftest import read_page, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_gets_a_second_target(fleet_databases, monkeypatch, no_guard, act_as):
    second = fleet_databases[1]
    monkeypatch.setenv("DEMO_SECOND_DSN", second.url)
    with second.connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS marketplace CASCADE")
        conn.execute(
            "TRUNCATE retention_runner.runs_run, retention_runner.retention_policy,"
            " retention_runner.auth_user RESTART IDENTITY CASCADE"
        )
    Target.objects.all().delete()
    try:
        # the second database's demo data (dev.py: `demo --no-users` with its URL)
        Target.objects.create(name="seed", dsn_env="DEMO_SECOND_DSN")
        with C.on("seed"):
            ensure_marketplace(DemoParams(rows=4000, seed=7, tenants=10))
        Target.objects.all().delete()
        out = StringIO()
        call_command("demo", "--rows", "4000", "--fleet-dsn-env", "DEMO_SECOND_DSN", stdout=out)
        text = out.getvalue()
        assert "target second registered (DEMO_SECOND_DSN)" in text
        assert "policy marketplace-events-second: approved" in text
        assert Target.objects.get(name="second").group == "demo"

        from django.contrib.auth.models import User

        act_as(User.objects.get(username="oscar"))
        (key,) = run_cli("trigger", "marketplace-events-second").split()
        assert key.startswith("second:marketplace-events-second/")
        run_cli("drain", key, "--until-idle", "--workers", "2")
        assert json.loads(run_cli("status", key, "--json"))["state"] == "drained"
        client = Client()
        client.force_login(User.objects.get(username="victor"))
        page = read_page(client, "/")
        assert "converged on 1 of 1 targets" in page
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP SCHEMA IF EXISTS marketplace CASCADE")
        with second.connect() as conn:
            conn.execute("DROP SCHEMA IF EXISTS marketplace CASCADE")
        C.close_all()
