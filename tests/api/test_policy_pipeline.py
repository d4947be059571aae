"""Policies as code, as a pipeline runs it: a directory of three policy files, ``retention
policy plan`` (the API client against a live server) shows the two that differ from what is
approved, ``apply`` submits them for a second person, another member of compliance approves
one in the browser, and ``plan`` shows the one left."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import User

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs a loop

from playwright.sync_api import expect  # noqa: E402

from core.models import OperatorAction  # noqa: E402
from core.tokens import create_token  # noqa: E402
from retention import actions  # noqa: E402
from retention.models import PolicyVersion  # noqa: E402
from retention.spec import load_toml  # noqa: E402
from tests.dashboard.test_browser_axe import violations  # noqa: E402
from tests.runs.conftest import create_events  # noqa: E402

from .live import gunicorn, with_api  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def policy_file(slug: str, retention: str) -> str:
    return f'''slug = "{slug}"
name = "{slug} older than {retention}"
table = "public.rr_{slug.replace("-", "_")}"
key = "id"
timestamp = "occurred_at"
tenant = "tenant_id"
retention = "{retention}"
schedule = "0 3 * * *"
timezone = "UTC"
chunk_size = 200
'''


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with gunicorn() as url:
        yield url


def approve(text: str, make_user) -> None:
    author = User.objects.filter(username="ann").first() or make_user("ann", "compliance")
    approver = User.objects.filter(username="abe").first() or make_user("abe", "compliance")
    version = actions.apply_spec(load_toml(text), author=author)
    version = actions.submit_version(version, actor=author, reason="first")
    actions.approve_version(version, actor=approver, reason="first")


def test_plan_apply_approve_in_the_browser_plan_again(server, browser, make_user, tmp_path):
    for table in ("audit_log", "sessions", "uploads"):
        create_events(500, name=f"rr_{table}")
    approve(policy_file("audit-log", "20 days"), make_user)
    approve(policy_file("sessions", "20 days"), make_user)
    repo = tmp_path / "policies"
    repo.mkdir()
    (repo / "audit-log.toml").write_text(policy_file("audit-log", "20 days"))  # as approved
    (repo / "sessions.toml").write_text(policy_file("sessions", "14 days"))  # shorter
    (repo / "uploads.toml").write_text(policy_file("uploads", "30 days"))  # new
    pipeline = make_user("ci-bot", "compliance")
    _, token = create_token(pipeline, name="policy pipeline")

    def retention(*args):
        return with_api(args, url=server, token=token)

    plan = retention("policy", "plan", str(repo))
    assert plan.returncode == 2, plan.stderr
    assert "audit-log: no change (approved v1, audit-log.toml)" in plan.stdout
    assert "sessions: change (approved v1 -> sessions.toml)" in plan.stdout
    assert "~ retention: 20 days -> 14 days" in plan.stdout
    assert "uploads: change (new policy -> uploads.toml)" in plan.stdout
    assert plan.stdout.count("  preview: eligible ") == 2
    assert plan.stdout.rstrip().endswith("plan: 2 change(s), 1 unchanged")

    applied = retention("policy", "apply", str(repo), "--reason", "PR #42 shorter sessions")
    assert applied.returncode == 2, applied.stderr
    assert "sessions v2 submitted" in applied.stdout and "uploads v1 submitted" in applied.stdout
    again = retention("policy", "apply", str(repo), "--reason", "PR #42 re-run")
    assert again.returncode == 0, again.stderr  # idempotent: nothing new
    assert "sessions v2 already submitted" in again.stdout
    assert PolicyVersion.objects.filter(policy__slug="sessions").count() == 2
    rows = OperatorAction.objects.filter(action="version.submit", actor="ci-bot")
    assert {row.details["via"] for row in rows} == {"api"} and rows.count() == 2

    officer = make_user("cora", "compliance")  # a second person approves, in the browser
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{server}/login/")
    page.fill("input[name=username]", officer.username)
    page.fill("input[name=password]", "cora-pw")
    page.click("button[type=submit]")
    expect(page.locator(".who")).to_contain_text("cora")
    page.goto(f"{server}/policies/uploads/v1/")
    assert violations(page) == []  # axe-core, as on every page (test_browser_axe.py)
    page.locator('form[action$="/approve/"] input[name=reason]').fill("PR #42 reviewed")
    page.locator('form[action$="/approve/"] input[name=password]').fill("cora-pw")
    page.locator('form[action$="/approve/"] button').click()
    expect(page.locator("h1 .badge")).to_have_text("approved")
    context.close()

    plan = retention("policy", "plan", str(repo))
    assert plan.returncode == 2, plan.stderr
    assert "uploads: no change (approved v1, uploads.toml)" in plan.stdout
    assert "sessions: change (approved v1 -> sessions.toml; v2 submitted, awaiting approval)" in (
        plan.stdout
    )
    assert plan.stdout.rstrip().endswith("plan: 1 change(s), 2 unchanged")


def test_a_bad_file_is_one_error_and_nothing_is_submitted(server, make_user, tmp_path):
    create_events(200, name="rr_sessions")
    repo = tmp_path / "policies"
    repo.mkdir()
    (repo / "sessions.toml").write_text(policy_file("sessions", "14 days"))
    (repo / "broken.toml").write_text(policy_file("broken", "14 days"))  # no such table
    _, token = create_token(make_user("ci-bot", "compliance"), name="policy pipeline")

    for command in ("plan", "apply"):
        args = ("policy", command, str(repo)) + (
            ("--reason", "PR #43") if command == "apply" else ()
        )
        result = with_api(args, url=server, token=token)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert "broken.toml:3: error: table public.rr_broken does not exist" in result.stdout
    assert not PolicyVersion.objects.exists()
