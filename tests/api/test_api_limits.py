"""The API holds the pages' limits (docs/security.md, "Expensive work is bounded"): a live
preview and a plan are compliance's, each preview computed at most once per version (or
content) and minute under the version page's advisory lock, at most
``MAX_PLAN_PREVIEWS`` per plan; a policy file learns nothing of a table this login may not
read; the schema and docs need a token unless published."""

from __future__ import annotations

import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from psycopg import sql

from retention import plan as plan_module
from retention import preview as preview_module
from tests.security.roles import apply_grants

pytestmark = pytest.mark.django_db

TOML = Path(__file__).with_name("events.toml").read_text()


def files(*texts: str) -> dict:
    return {"files": [{"name": f"p{i}.toml", "toml": t} for i, t in enumerate(texts)]}


@pytest.mark.parametrize("role", ["viewer", "oncall", "auditor"])
def test_a_viewer_oncall_or_auditor_token_may_not_preview_or_plan(api, world, role):
    status, error = api.get("/policies/events/preview", as_=role)
    assert (status, error["code"]) == (403, "forbidden")
    assert "compliance" in error["message"]
    status, error = api.post("/policy-files/plan", files(TOML), as_=role)
    assert (status, error["code"]) == (403, "forbidden")


def test_compliance_previews_and_plans(api, world):
    status, answer = api.get("/policies/events/preview", as_="compliance")
    assert status == 200 and answer["preview"]["eligible"] > 0
    assert answer["preview"]["timeout_ms"] == preview_module.LIVE_PREVIEW_TIMEOUT_MS
    status, answer = api.post("/policy-files/plan", files(TOML), as_="compliance")
    assert status == 200 and "preview: eligible" in answer["stdout"]


def _now_at(monkeypatch, moment):
    monkeypatch.setattr(preview_module.timezone, "now", lambda: moment)


def test_the_api_preview_is_computed_once_per_version_and_minute(api, world, monkeypatch):
    now = timezone.now().replace(second=5)
    _now_at(monkeypatch, now)
    _, first = api.get("/policies/events/preview", as_="compliance")
    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.rr_events WHERE occurred_at < now() - interval '40 days'")
    _now_at(monkeypatch, now + timedelta(seconds=50))
    _, again = api.get("/policies/events/preview", as_="compliance")
    assert again["preview"] == first["preview"]  # the cached result: no second scan
    _now_at(monkeypatch, now + timedelta(seconds=60))
    _, fresh = api.get("/policies/events/preview", as_="compliance")
    assert fresh["preview"]["eligible"] < first["preview"]["eligible"]


def test_a_plan_previews_each_content_once_a_minute_and_a_bounded_number_per_plan(
    api, world, monkeypatch
):
    now = timezone.now().replace(second=5)
    _now_at(monkeypatch, now)
    many = [
        TOML.replace('slug = "events"', f'slug = "events-{i}"').replace("30 days", f"{31 + i} days")
        for i in range(plan_module.MAX_PLAN_PREVIEWS + 2)
    ]
    status, answer = api.post("/policy-files/plan", files(*many), as_="compliance")
    assert status == 200, answer
    taken = answer["stdout"].count("  preview: eligible ")
    skipped = answer["stdout"].count("  preview: not taken (at most ")
    assert (taken, skipped) == (plan_module.MAX_PLAN_PREVIEWS, 2)

    # the same content again within the minute: the cached previews, not a new scan
    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.rr_events WHERE occurred_at < now() - interval '45 days'")
    _now_at(monkeypatch, now + timedelta(seconds=30))
    _, again = api.post("/policy-files/plan", files(*many), as_="compliance")
    assert again["stdout"] == answer["stdout"]
    _now_at(monkeypatch, now + timedelta(seconds=60))
    _, fresh = api.post("/policy-files/plan", files(*many), as_="compliance")
    assert fresh["stdout"] != answer["stdout"]


@pytest.fixture
def web_login(world):
    """The web process's database login as ``retention grants apply`` makes it (its target:
    the policy's table), taken by this connection for the requests that follow; and a table
    of the application it was never granted."""
    role = f"rr_web_{os.getpid()}_{secrets.token_hex(3)}"
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)).as_string(cur.connection)
        )
        cur.execute(
            "CREATE TABLE public.rr_payroll (id bigint PRIMARY KEY, paid_at timestamptz,"
            " salary numeric)"
        )
    apply_grants("web", role, "public.rr_events")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)).as_string(cur.connection))
    yield role
    with connection.cursor() as cur:
        cur.execute("RESET ROLE")


def _payroll(table: str, *, timestamp: str = "paid_at", key: str = "id") -> str:
    return (
        TOML.replace('slug = "events"', 'slug = "payroll"')
        .replace('table = "public.rr_events"', f'table = "{table}"')
        .replace('timestamp = "occurred_at"', f'timestamp = "{timestamp}"')
        .replace('key = "id"', f'key = "{key}"')
        .replace('tenant = "tenant_id"\n', "")
        .replace('chunking = "tenant"\n', "")
        .split("[limits]")[0]
    )


def test_a_plan_tells_nothing_of_a_table_this_login_may_not_read(api, web_login):
    with connection.cursor() as cur:  # the test can fail: the table is there
        cur.execute("SELECT to_regclass('public.rr_payroll') IS NOT NULL")
        assert cur.fetchone()[0]
    answers = {}
    for table in ("public.rr_payroll", "public.rr_no_such_table"):
        for column in ("paid_at", "no_such_column"):
            status, answer = api.post(
                "/policy-files/plan", files(_payroll(table, timestamp=column)), as_="compliance"
            )
            assert status == 200, answer
            # a suggestion depends on the name typed, among the tables the login may read
            text = re.sub(r" \(did you mean [^)]*\)", "", answer["stdout"])
            answers[table, column] = text.replace(table, "TABLE")
    # existing or not, a column of it or not: the same answer, naming no column or type
    assert len(set(answers.values())) == 1, answers
    # and a near miss of its name is never answered with it
    status, answer = api.post(
        "/policy-files/plan", files(_payroll("public.rr_payrol")), as_="compliance"
    )
    assert "does not exist" in answer["stdout"] and "rr_payroll" not in answer["stdout"]
    only = next(iter(answers.values()))
    assert "does not exist (or this login may not read it)" in only
    assert "salary" not in only and "numeric" not in only
    # a table it was granted is planned as before
    status, answer = api.post("/policy-files/plan", files(TOML), as_="compliance")
    assert status == 200 and "events: change" in answer["stdout"], answer


def test_the_schema_and_docs_need_a_token_unless_published(api, people, settings):
    for path in ("/openapi.json", "/docs"):
        status, error = api.get(path)
        assert (status, error["code"]) == (401, "unauthenticated"), path
        status, error = api.get(path, token="rrt_" + "x" * 43)
        assert (status, error["code"]) == (401, "token_refused"), path
        status, _ = api.get(path, as_="viewer")
        assert status == 200, path
    # a signed-in person on the docs page (it fetches the schema with the session)
    api.client.force_login(people["auditor"])
    assert api.get("/openapi.json")[0] == 200
    api.client.logout()
    settings.API_PUBLIC_SCHEMA = True
    status, schema = api.get("/openapi.json")
    assert status == 200 and schema["info"]["title"] == "Retention Runner API"
