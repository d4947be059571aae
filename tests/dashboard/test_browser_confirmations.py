"""Destructive actions ask first, in headless Chromium, and say what they will do: turning
the kill switch on, cancelling a run, discarding a dead letter, pausing a policy, rejecting
a version and releasing a legal hold (docs/runbook.md, "Confirmations"). Declining changes
nothing; accepting acts."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from retention import actions as retention_actions
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion
from retention.spec import PolicySpec
from runs.models import DeadLetter, Run
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures
from tests.factories import events_spec

from .conftest import make_dead_letter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def answer(page, accept: bool) -> list[str]:
    """Answer the next dialogs with ``accept``; the list fills with their messages."""
    said: list[str] = []

    def handle(dialog):
        said.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.on("dialog", handle)
    return said


def declined(page, click) -> None:
    """``click()`` brings up the question (answered by ``answer``) and, declined, the browser
    sends nothing: the form's submit event ends cancelled, on the page it started on."""
    page.evaluate(
        "window.__sent = null; window.addEventListener('submit',"
        " (event) => { window.__sent = !event.defaultPrevented })"
    )
    with page.expect_event("dialog"):
        click()
    page.wait_for_function("window.__sent !== null")
    assert page.evaluate("window.__sent") is False


def test_turning_the_kill_switch_on_and_cancelling_a_run_ask_first(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
):
    page = login("oncall")
    said = answer(page, accept=False)
    page.goto(f"{live_server.url}/")
    page.click("#kill-switch-form summary")
    page.fill('#kill-switch-form input[name="reason"]', "INC-52")
    declined(page, lambda: page.click("#kill-switch-form button[type=submit]"))
    assert len(said) == 1 and "no chunk of any policy is admitted" in said[0], said
    assert "1 active run" in said[0]
    assert not KillSwitch.is_on()

    page.goto(f"{live_server.url}/runs/{active_run.pk}/")
    page.fill('input[aria-label="reason to cancel"]', "INC-53")
    declined(page, lambda: page.click('[data-testid="cancel"]'))
    pending = active_run.chunks.filter(state="pending").count()
    assert active_run.run_key in said[1] and f"{pending} pending chunks" in said[1], said
    assert Run.objects.get(pk=active_run.pk).state == Run.State.ACTIVE

    accepted = login("oncall")
    answer(accepted, accept=True)
    accepted.goto(f"{live_server.url}/runs/{active_run.pk}/")
    accepted.fill('input[aria-label="reason to cancel"]', "INC-53")
    accepted.click('[data-testid="cancel"]')
    expect(accepted.locator('[data-testid="run-state"]')).to_contain_text("ancel")
    assert Run.objects.get(pk=active_run.pk).state == Run.State.CANCELLED


def test_discarding_a_dead_letter_and_pausing_a_policy_ask_first(
    login,  # noqa: F811
    live_server,
    make_user,
):
    letter = make_dead_letter(make_user, slug="gone", rows=300)
    page = login("oncall")
    said = answer(page, accept=False)
    page.goto(f"{live_server.url}/runs/dead-letters/")
    entry = page.locator(f'[data-letter="{letter.pk}"]')
    entry.locator('input[aria-label="reason to discard"]').fill("table is gone for good")
    declined(page, lambda: entry.locator('[data-testid="discard"]').click())
    assert len(said) == 1 and f"#{letter.pk}" in said[0] and "not deleted" in said[0], said
    page.locator(f'input[aria-label="choose dead letter {letter.pk}"]').check()
    page.fill('input[aria-label="reason for the ticked letters"]', "gone")
    declined(page, lambda: page.click('#bulk-letters button[value="discard"]'))
    assert len(said) == 2 and "ticked dead letters" in said[1], said
    assert DeadLetter.objects.get(pk=letter.pk).resolution == DeadLetter.Resolution.OPEN

    page.goto(f"{live_server.url}/policies/gone/")
    page.fill('form[action$="/pause/"] input[name="reason"]', "INC-54")
    declined(page, lambda: page.click('form[action$="/pause/"] button'))
    assert len(said) == 3 and "Pause policy gone?" in said[2], said
    assert "until it is resumed" in said[2]
    assert not Policy.objects.get(slug="gone").paused


def test_rejecting_a_version_and_releasing_a_hold_ask_first(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
    users,
    make_user,
):
    carla = users["compliance"]
    draft = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(retention="30 days")), author=carla
    )
    version = retention_actions.submit_version(draft, actor=carla, reason="legal asked")
    hold = retention_actions.place_hold(
        policy=active_run.policy, tenant="3", actor=carla, reason="case 12"
    )
    page = login("compliance", user=make_user("cora", "compliance"))
    said = answer(page, accept=False)
    page.goto(f"{live_server.url}/policies/approvals/")
    card = page.locator(f'[data-approval="events-v{version.number}"]')
    card.locator('input[aria-label^="reason to reject"]').fill("not now")
    declined(page, lambda: card.locator('[data-testid="reject"]').click())
    assert len(said) == 1 and f"Reject v{version.number} of events?" in said[0], said
    assert PolicyVersion.objects.get(pk=version.pk).state == PolicyVersion.State.SUBMITTED

    page.goto(f"{live_server.url}/policies/holds/{hold.pk}/release/")
    page.fill('form.decide input[name="reason"]', "case closed")
    declined(page, lambda: page.click("form.decide button"))
    assert len(said) == 2 and f"hold #{hold.pk}" in said[1], said
    assert "rows become eligible" in said[1] and "next run" in said[1]
    assert LegalHold.objects.get(pk=hold.pk).release_requested_by in ("", None)
