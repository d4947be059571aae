from __future__ import annotations

from django.test import Client


def post(client: Client, url: str, data: dict, *, page: str = "/", follow: bool = True):
    """POST like a browser: fetch a page for the CSRF cookie, then send its token."""
    token = client.get(page).cookies.get("csrftoken") or client.cookies.get("csrftoken")
    return client.post(url, {**data, "csrfmiddlewaretoken": token.value}, follow=follow)


def rows_deleted(run) -> int:
    """Rows the audit trail records as deleted for ``run``, counted here independently."""
    from django.db.models import Sum

    return int(run.audit_records.aggregate(s=Sum("rows_deleted"))["s"] or 0)
