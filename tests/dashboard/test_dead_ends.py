"""Dead ends lead somewhere: an unknown policy offers the closest slugs and the full list;
error pages keep the layout and its navigation; a 403 names the role and logs no traceback."""

from __future__ import annotations

import logging

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from tests.factories import approved_policy, events_spec

pytestmark = pytest.mark.django_db


def test_an_unknown_policy_offers_the_closest_matches_and_the_full_list(
    client_for, events_policy, make_user
):
    approved_policy(make_user, **events_spec(slug="invoices", table="rr_events"))
    html = client_for("viewer").get(reverse("home"), {"policy": "evnets"}).content.decode()
    assert "No policy named" in html
    suggestions = html[html.index('data-testid="closest"') :]
    assert 'href="/?policy=events"' in suggestions.split("</p>")[0]
    everything = html[html.index('data-testid="all-policies"') :]
    assert 'href="/?policy=events"' in everything and 'href="/?policy=invoices"' in everything


@override_settings(DEBUG=False)
def test_a_404_page_keeps_the_navigation(client_for):
    response = client_for("viewer").get("/runs/999999/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="error-404"' in html
    assert 'href="/runs/"' in html and "<nav>" in html


@override_settings(DEBUG=False)
def test_a_403_names_the_role_needed_and_logs_no_traceback(client_for, events_policy, caplog):
    client = client_for("viewer")
    token = client.get(reverse("home")).cookies["csrftoken"].value
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.post(
            reverse("runs:kill_switch"), {"on": "1", "reason": "x", "csrfmiddlewaretoken": token}
        )
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-testid="error-403"' in html
    assert "oncall" in html and "<nav>" in html
    forbidden = [r for r in caplog.records if r.name == "django.request"]
    assert forbidden, "the 403 is still logged"
    formatted = (
        logging.getLogger().handlers[0].format(forbidden[0]) if logging.getLogger().handlers else ""
    )
    assert "Traceback" not in formatted
    assert all(r.exc_info is None for r in forbidden)


@override_settings(DEBUG=False)
def test_a_500_page_keeps_the_layout_and_links(db):
    from django.views import defaults

    response = defaults.server_error(Client().get("/").wsgi_request)
    html = response.content.decode()
    assert response.status_code == 500
    assert 'data-testid="error-500"' in html
    assert 'href="/runs/"' in html and "Retention Runner" in html
