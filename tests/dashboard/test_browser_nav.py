"""The top bar in headless Chromium: one line at 1024 px for every role, the longest menus
(compliance, auditor) included."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# (spread of the links' tops, tallest link): a link whose words wrap is two lines tall
LINKS_ON_ONE_LINE = """() => {
  const boxes = Array.from(document.querySelectorAll('header.top nav a, header.top .who > *'))
    .map(a => a.getBoundingClientRect());
  const tops = boxes.map(b => b.top);
  return [Math.max(...tops) - Math.min(...tops), Math.max(...boxes.map(b => b.height))];
}"""


@pytest.mark.parametrize("role", ["compliance", "auditor", "oncall", "viewer"])
def test_the_nav_does_not_wrap_at_1024_pixels(login, live_server, role):  # noqa: F811
    page = login(role, width=1024)
    page.goto(f"{live_server.url}/")
    spread, tallest = page.evaluate(LINKS_ON_ONE_LINE)
    assert spread < 12 and tallest < 28, (spread, tallest)  # one line of 14 px text
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1024
