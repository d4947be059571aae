"""The overview card never lags the run page (headless Chromium): with both open side by side
while the real engine advances the run, the card and the page show the same percentage at
every moment, and the command line's once a refresh period has passed.

The two pages run on Playwright's fake clock, moved forward together, so "a refresh period
later" is exact and the pages' refreshes happen where they would in a browser: the run page
is opened 2.5 s after the overview, as someone opening it from the card would."""

from __future__ import annotations

import json
import re
import time
from io import StringIO

import pytest
from django.core.management import call_command

from runs.engine import worker
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PERIOD_MS = 5000  # the live parts' refresh period (static/js/app.js: REFRESH_MS)
STEP_MS = 500
PERCENT = re.compile(r"(\d+)%")


def cli_percent(run) -> int:
    out = StringIO()
    call_command("retention", "status", run.run_key, "--json", stdout=out)
    return json.loads(out.getvalue())["percent"]


def settled(page) -> None:
    """Wait (in real time) until the page's refresh requests have been answered and swapped in."""
    for _ in range(200):
        if not page.evaluate("!!document.querySelector('.htmx-request')"):
            return
        time.sleep(0.05)
    raise AssertionError("a refresh did not finish")


def shown(locator) -> int:
    return int(PERCENT.search(locator.inner_text()).group(1))


def test_the_overview_card_shows_what_the_run_page_and_the_cli_show_after_each_refresh(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
):
    start = (int(time.time() * 1000) // PERIOD_MS + 1) * PERIOD_MS + 1000
    overview, run_page = login("viewer"), login("oncall")
    for page in (overview, run_page):
        page.clock.install(time=start - 1000)
        page.clock.pause_at(start)  # from here on, time moves only with run_for
    overview.goto(f"{live_server.url}/")
    run_page.clock.run_for(2500)  # opened from the card 2.5 s later
    run_page.goto(f"{live_server.url}/runs/{active_run.pk}/")
    overview.clock.run_for(2500)
    card = overview.locator('[data-policy="events"] [data-testid="progress"]')
    page = run_page.locator('[data-testid="run-progress"]')
    seen = [(cli_percent(active_run), shown(card), shown(page))]

    for _ in range(4):
        assert worker.process_one(active_run).kind == worker.DONE
        cli = cli_percent(active_run)
        assert cli != seen[-1][0], "the step must move the percentage"
        for _ in range(PERIOD_MS // STEP_MS):
            for p in (overview, run_page):
                p.clock.run_for(STEP_MS)
            settled(overview), settled(run_page)
            seen.append((cli, shown(card), shown(page)))
            assert seen[-1][1] == seen[-1][2], f"card and run page differ: {seen}"
        assert seen[-1] == (cli, cli, cli), f"a refresh period later: {seen}"
