from __future__ import annotations

from django.test import Client


def post(client: Client, url: str, data: dict, *, page: str = "/", follow: bool = True):
    """POST like a browser: fetch a page for the CSRF cookie, then send its token."""
    token = client.get(page).cookies.get("csrftoken") or client.cookies.get("csrftoken")
    return client.post(url, {**data, "csrfmiddlewaretoken": token.value}, follow=follow)
