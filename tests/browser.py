"""Headless Chromium for the browser tests: Debian's system browser, driven by Playwright
(the ``browser`` and ``login`` fixtures are in tests/conftest.py)."""

from __future__ import annotations

REFRESH_S = 5  # the live parts' refresh period (static/js/app.js, REFRESH_MS)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def session_cookie(user, url: str) -> dict:
    """A signed-in session of ``user`` as the browser's cookie for ``url``: the session Django
    opens at sign-in, without hashing the password again (signing in through the form has its
    own test, tests/dashboard/test_browser.py::test_a_person_signs_in_through_the_form)."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    return {"name": settings.SESSION_COOKIE_NAME, "value": key, "url": url}


def refreshes(page) -> int:
    return page.evaluate("window.__swaps || 0")


def count_swaps(page) -> None:
    """Count the page's swaps (``refreshes``), beats and htmx requests not yet answered."""
    page.evaluate(
        "document.body.addEventListener('htmx:afterSwap', () => {"
        " window.__swaps = (window.__swaps || 0) + 1 });"
        "document.addEventListener('beat', () => { window.__beats = (window.__beats || 0) + 1 });"
        "window.__asking = 0;"
        "document.body.addEventListener('htmx:beforeRequest', () => { window.__asking += 1 });"
        "document.body.addEventListener('htmx:afterRequest', () => { window.__asking -= 1 })"
    )


def open_on_a_clock(page, url: str) -> None:
    """Open ``url`` with the page's clock under the test's hand (Playwright's fake timers):
    ``beats(page, n)`` moves it on by ``n`` refresh periods at once instead of waiting them."""
    page.clock.install()
    page.goto(url)
    count_swaps(page)


def beats(page, n: int) -> None:
    """Move the page's clock on by ``n`` refresh periods (each fires one beat), then wait until
    every request they made has been answered and its answer swapped in."""
    before = page.evaluate("window.__beats || 0")
    page.clock.run_for(n * REFRESH_S * 1000)
    assert page.evaluate("window.__beats || 0") - before == n
    page.wait_for_function("window.__asking === 0")
