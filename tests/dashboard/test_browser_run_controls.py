"""The run page's controls in headless Chromium: the live part refreshes every 5 s, yet a
reason being typed into Pause, Resume or Cancel (and the field's focus) survives it, and no
page logs a script error (docs/runbook.md, "Run page"). The tests move the page's clock on
by whole refresh periods rather than wait them out."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.actions import pause_run
from tests.browser import beats, open_on_a_clock, refreshes
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def watch_console(page) -> list[str]:
    """Collect every console error and uncaught exception of ``page``."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


@pytest.mark.parametrize("control", ["pause", "cancel", "resume"])
def test_a_reason_being_typed_survives_two_refreshes(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
    users,
    control,
):
    if control == "resume":
        pause_run(active_run, actor=users["oncall"], reason="INC-9 replica lag")
    page = login("oncall")
    errors = watch_console(page)
    open_on_a_clock(page, f"{live_server.url}/runs/{active_run.pk}/")
    field = page.locator(f'input[aria-label="reason to {control}"]')
    field.click()
    field.type("INC-77 lock waits on ord")
    beats(page, 2)
    expect(field).to_have_value("INC-77 lock waits on ord")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == (
        f"reason to {control}"
    )
    field.type("ers")  # the caret is where it was
    expect(field).to_have_value("INC-77 lock waits on orders")
    assert errors == []


def test_the_live_part_refreshes_again_once_the_reason_is_cleared(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
):
    page = login("oncall")
    errors = watch_console(page)
    open_on_a_clock(page, f"{live_server.url}/runs/{active_run.pk}/")
    beats(page, 1)
    assert refreshes(page) >= 1  # nothing typed: it refreshes
    field = page.locator('input[aria-label="reason to pause"]')
    field.fill("INC-78")
    field.fill("")
    page.locator("h1").click()  # focus leaves the controls
    before = refreshes(page)
    beats(page, 1)
    assert refreshes(page) > before
    assert errors == []


def test_no_page_logs_a_script_error(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
):
    page = login("oncall")
    errors = watch_console(page)
    for path in (
        "/",
        f"/runs/{active_run.pk}/",
        "/runs/",
        "/runs/dead-letters/",
        "/runs/activity/",
        "/policies/",
        "/policies/events/",
        "/policies/approvals/",
        "/policies/holds/",
    ):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert errors == [], path
