"""The run page in headless Chromium says when its figures are frozen: while a reason is
typed the live part does not refresh, and "Updates paused while you type" is shown until the
reason is cleared and the focus has left the controls."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser import beats, open_on_a_clock
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures
from tests.dashboard.test_browser_run_controls import watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_marker_says_the_updates_are_paused_while_a_reason_is_typed(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
):
    page = login("oncall")
    errors = watch_console(page)
    open_on_a_clock(page, f"{live_server.url}/runs/{active_run.pk}/")
    marker = page.get_by_test_id("refresh-paused")
    expect(marker).to_be_hidden()
    field = page.locator('input[aria-label="reason to pause"]')
    field.click()
    field.type("INC-80 replica")
    expect(marker).to_be_visible()
    expect(marker).to_contain_text("Updates paused while you type")
    beats(page, 1)  # a beat passes: still frozen, still said
    expect(marker).to_be_visible()
    field.fill("")
    page.locator("h1").click()
    expect(marker).to_be_hidden()
    assert errors == []
