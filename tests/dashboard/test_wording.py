"""Small things users read: flash messages are a list inside a status region (axe
``listitem``), counts carry thousands separators, ages are instants with their zone rather
than "0 minutes ago"."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from runs.actions import set_kill_switch

from .helpers import post

pytestmark = pytest.mark.django_db


def test_flash_messages_are_list_items_of_a_list_inside_the_status_region(client_for, run):
    client = client_for("oncall")
    page = post(
        client,
        reverse("runs:pause", args=[run.pk]),
        {"reason": "INC-3"},
        page=reverse("runs:detail", args=[run.pk]),
    )
    html = page.content.decode()
    assert "Pause run" in html
    assert not re.search(r'<ul[^>]*role="status"', html)  # a role would hide the list
    assert re.search(r'<div[^>]*role="status"[^>]*>\s*<ul class="messages">\s*<li', html)


def test_the_kill_switch_banner_and_dead_letters_say_when_not_zero_minutes_ago(
    client_for, run, users, dead_letter
):
    set_kill_switch(True, actor=users["oncall"], reason="INC-52")
    client = client_for("viewer")
    overview = client.get(reverse("home")).content.decode()
    page = client.get(reverse("runs:detail", args=[dead_letter.run_id])).content.decode()
    for html in (overview, page):
        # "0 minutes", not the tail of a duration such as "8 hours, 20 minutes"
        assert "minutes ago" not in html and not re.search(r"(?<!\d)0\xa0minutes", html)
    assert "UTC" in overview.split('data-testid="kill-switch-on"')[1].split("</div>")[0]


def test_a_verification_reason_counts_with_thousands_separators():
    from runs.actions import verification_reason

    reason = verification_reason(
        {"remaining": 0, "deferred_by_holds": 22302, "not_eligible_null": 1500, "discarded": []}
    )
    assert "22,302 row(s) deferred" in reason and "1,500 row(s) not eligible" in reason
