"""The policy page's form editor in headless Chromium: a bad value keeps the form, with the
error next to its field (docs/policies.md, "The form editor")."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from retention.models import PolicyVersion
from tests.dashboard.test_browser import browser, login  # noqa: F401 - fixtures
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import create_events

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_bad_value_keeps_the_form_with_the_error_next_to_its_field(
    login,  # noqa: F811
    live_server,
    make_user,
):
    create_events(300)
    approved_policy(make_user, **events_spec())
    page = login("compliance")
    page.goto(f"{live_server.url}/policies/events/")
    editor = page.locator('[data-testid="form-editor"]')
    editor.locator('input[name="retention"]').fill("45 dayz")
    editor.locator('input[name="chunk_size"]').fill("300")
    editor.locator("button").click()

    editor = page.locator('[data-testid="form-editor"]')
    expect(editor).to_be_visible()
    expect(editor.locator('input[name="retention"]')).to_have_value("45 dayz")
    expect(editor.locator('input[name="chunk_size"]')).to_have_value("300")  # the rest kept
    error = editor.locator('[data-field-error="retention"]')
    expect(error).to_contain_text("retention must look like")
    assert editor.locator('input[name="retention"]').get_attribute("aria-invalid") == "true"
    assert page.locator("h1").inner_text().startswith("Events older than 20 days")
    assert PolicyVersion.objects.count() == 1

    editor.locator('input[name="retention"]').fill("45 days")
    editor.locator("button").click()
    expect(page.locator("h1 .badge")).to_have_text("draft")
    assert PolicyVersion.objects.get(number=2).parsed.retention == "45 days"
