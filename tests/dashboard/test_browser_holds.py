"""A legal hold's release in headless Chromium, as two members of compliance do it: one
requests it in one click from the Legal holds page; the request waits in the other's
Approvals queue, and approving it asks for the password again, as approving a version does
(docs/policies.md, "Releasing a hold")."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from retention import actions as retention_actions
from retention.models import LegalHold
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures
from tests.dashboard.test_browser_axe import violations
from tests.dashboard.test_browser_confirmations import answer
from tests.dashboard.test_browser_run_controls import watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_release_is_requested_in_one_click_and_approved_from_the_queue_with_the_password(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
    users,
    make_user,
):
    carla = users["compliance"]
    hold = retention_actions.place_hold(
        policy=active_run.policy, tenant="3", actor=carla, reason="case 12"
    )
    page = login("compliance")
    errors = watch_console(page)
    answer(page, accept=True)
    page.goto(f"{live_server.url}/policies/holds/")
    page.locator(f'tr[data-hold="{hold.pk}"] [data-testid="request-release"]').click()
    expect(page.locator('[data-testid="release-impact"]')).to_contain_text("rows become eligible")
    assert violations(page) == []  # the release's confirmation page
    page.fill('form.decide input[name="reason"]', "case closed")
    page.click("form.decide button")
    expect(page.locator('[data-testid="release-requested"]')).to_contain_text("case closed")
    assert LegalHold.objects.get(pk=hold.pk).release_pending

    # the requester's queue lists it, to be decided by someone else
    page.goto(f"{live_server.url}/policies/approvals/")
    own = page.locator(f'[data-release="{hold.pk}"]')
    expect(own).to_contain_text("another member of compliance must approve")
    expect(own.locator('[data-testid="approve-release"]')).to_have_count(0)
    assert errors == []

    other = login("compliance", user=make_user("cora", "compliance"))
    answer(other, accept=True)
    other.goto(f"{live_server.url}/policies/approvals/")
    card = other.locator(f'[data-release="{hold.pk}"]')
    expect(card).to_contain_text("case closed")
    expect(card.locator('[data-testid="release-impact"]')).to_contain_text("rows become eligible")
    assert violations(other) == []  # the queue with a release in it
    card.locator('[data-testid="approve-release"]').click()

    # without the password nothing is released
    other.fill('form.decide input[name="reason"]', "counsel agrees")
    password = other.locator('[data-testid="reauth-password"]')
    expect(password).to_be_visible()
    password.evaluate("field => field.removeAttribute('required')")
    other.click("form.decide button")
    expect(other.locator(".messages")).to_contain_text(
        f"enter your password to confirm the release of hold #{hold.pk}"
    )
    assert LegalHold.objects.get(pk=hold.pk).active

    other.goto(f"{live_server.url}/policies/holds/{hold.pk}/approve-release/")
    other.fill('form.decide input[name="reason"]', "counsel agrees")
    other.fill('[data-testid="reauth-password"]', "cora-pw")
    other.click("form.decide button")
    expect(other.locator('[data-testid="released"]')).to_contain_text("counsel agrees")
    released = LegalHold.objects.get(pk=hold.pk)
    assert not released.active and released.released_by == "cora"
    other.goto(f"{live_server.url}/policies/approvals/")
    expect(other.locator(f'[data-release="{hold.pk}"]')).to_have_count(0)
