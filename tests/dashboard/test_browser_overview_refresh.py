"""The overview card keeps up with the run (headless Chromium): a page coming back into view
(a tab the browser throttled while hidden) refreshes at once instead of showing what it read
one or more polls ago; the card and the run page show the same figures as the read model."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.engine import worker
from runs.progress import progress_for
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BACK_IN_VIEW = (
    "Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});"
    "document.dispatchEvent(new Event('visibilitychange'))"
)


@pytest.mark.parametrize("where", ["overview", "run page"])
def test_a_page_back_in_view_shows_the_runs_progress_at_once(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
    where,
):
    page = login("viewer")
    url = "/" if where == "overview" else f"/runs/{active_run.pk}/"
    page.goto(f"{live_server.url}{url}")
    shown = (
        page.locator('[data-policy="events"] [data-testid="progress"]')
        if where == "overview"
        else page.locator('[data-testid="run-progress"]')
    )
    before = shown.inner_text()
    for _ in range(4):
        assert worker.process_one(active_run).kind == worker.DONE
    percent = progress_for([active_run.pk], now=timezone.now())[active_run.pk].percent
    assert f"{percent}%" not in before

    page.evaluate(BACK_IN_VIEW)
    # well before the next 5 s poll
    expect(shown).to_contain_text(f"{percent}%", timeout=2_000)
