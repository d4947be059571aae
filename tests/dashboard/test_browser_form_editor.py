"""The policy page's form editor in headless Chromium: a bad value keeps the form, with the
error next to its field, the field marked and brought into view; a keep rule's error counts
the rows as their labels do (from 1); a draft's page is headed with the draft's own name
(docs/policies.md, "The form editor")."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from retention.models import PolicyVersion
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


def test_a_keep_rules_error_names_its_row_as_labelled_and_the_draft_is_headed_with_its_name(
    login,  # noqa: F811
    live_server,
    make_user,
):
    create_events(300)
    approved_policy(make_user, **events_spec())
    page = login("compliance")
    page.goto(f"{live_server.url}/policies/events/")
    editor = page.locator('[data-testid="form-editor"]')
    editor.locator('input[name="name"]').fill("Marketplace events (legal review 2026)")
    second = 'input[aria-label="keep rule 2 column"]'
    editor.locator(second).fill("stauts")
    editor.locator('select[aria-label="keep rule 2 operator"]').select_option("=")
    editor.locator('input[aria-label="keep rule 2 value"]').fill('"void"')
    editor.locator("button").click()

    editor = page.locator('[data-testid="form-editor"]')
    error = editor.locator('[data-field-error="keep"]')
    expect(error).to_contain_text("keep rule 2 column 'stauts' does not exist")
    expect(error).to_contain_text("did you mean 'status'")
    assert "keep[" not in error.inner_text()
    field = editor.locator(second)
    assert field.get_attribute("aria-invalid") == "true"
    assert field.get_attribute("aria-describedby") == "error-keep"
    assert (
        editor.locator('input[aria-label="keep rule 1 column"]').get_attribute("aria-invalid")
        is None
    )
    expect(field).to_be_focused()  # the page opens at the refused field, not at its top
    expect(field).to_be_in_viewport()
    expect(error).to_be_in_viewport()
    assert PolicyVersion.objects.count() == 1

    field.fill("status")
    editor.locator("button").click()
    expect(page.locator("h1 .badge")).to_have_text("draft")
    expect(page.locator("h1")).to_contain_text("Marketplace events (legal review 2026) v2")
