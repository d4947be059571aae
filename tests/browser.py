"""Headless Chromium for the browser tests: Debian's system browser, driven by Playwright
(the ``browser`` and ``login`` fixtures are in tests/conftest.py)."""

from __future__ import annotations

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
