from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from core.formatting import number
from core.models import OperatorAction
from retention.models import KillSwitch
from runs.engine import worker
from runs.engine.schedules import schedule_name

from .conftest import make_dead_letter
from .helpers import rows_deleted

pytestmark = pytest.mark.django_db


def card_of(html: str, slug: str) -> str:
    start = html.index(f'data-policy="{slug}"')
    end = html.find("</section>", start)
    return html[start:end]


def test_the_overview_renders_fully_on_a_plain_get(client_for, run):
    response = client_for("viewer").get(reverse("home"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html
    assert 'hx-trigger="beat from:document' in html  # the refresh on the clock's beat
    card = card_of(html, "events")
    assert run.run_key in card
    assert "active" in card
    assert f"/runs/{run.pk}/" in card


def test_an_htmx_request_gets_only_the_fragment(client_for, run):
    response = client_for("viewer").get(reverse("home"), HTTP_HX_REQUEST="true")

    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html
    assert "<header" not in html.split('data-policy="events"')[0]
    assert 'data-policy="events"' in html


def test_progress_shows_rows_deleted_and_chunks_done(client_for, run):
    deleted = rows_deleted(run)

    card = card_of(client_for("viewer").get(reverse("home")).content.decode(), "events")

    assert f"{number(deleted)} rows deleted" in card
    assert "3/" in card  # three chunks done out of the planned ones
    assert 'style="width: ' in card


def test_the_overview_moves_as_the_run_drains(client_for, run, no_guard):
    client = client_for("viewer")
    before = card_of(client.get(reverse("home"), HTTP_HX_REQUEST="true").content.decode(), "events")

    worker.drain(run.pk, budget_s=60)

    after = card_of(client.get(reverse("home"), HTTP_HX_REQUEST="true").content.decode(), "events")
    run.refresh_from_db()
    assert run.state == "drained"
    assert "100%" in after and "100%" not in before
    assert f"{number(rows_deleted(run))} rows deleted" in after


def test_next_tick_comes_from_the_policy_schedule(client_for, run):
    when = timezone.now() + timedelta(hours=5)
    Schedule.objects.update_or_create(
        name=schedule_name(run.policy),
        defaults={"func": "runs.tasks.trigger_scheduled", "next_run": when, "repeats": 1},
    )

    card = card_of(client_for("viewer").get(reverse("home")).content.decode(), "events")

    assert when.strftime("%Y-%m-%d %H:%M") in card


def test_a_dead_letter_marks_the_policy_as_needing_attention(client_for, run, make_user):
    make_dead_letter(make_user, slug="gone")

    html = client_for("viewer").get(reverse("home")).content.decode()

    gone = card_of(html, "gone")
    assert "needs attention" in gone
    assert "1 open" in gone
    assert "needs attention" not in card_of(html, "events")


def test_the_alert_link_filters_to_one_policy(client_for, run, make_user):
    make_dead_letter(make_user, slug="gone")

    response = client_for("viewer").get(reverse("home") + "?policy=gone")

    html = response.content.decode()
    assert 'data-policy="gone"' in html
    assert 'data-policy="events"' not in html
    assert 'hx-get="/?policy=gone"' in html


def test_oncall_sees_the_kill_switch_form_and_a_viewer_does_not(client_for, run):
    assert "Turn kill switch ON" in client_for("oncall").get(reverse("home")).content.decode()
    assert "Turn kill switch" not in client_for("viewer").get(reverse("home")).content.decode()


def test_oncall_flips_the_kill_switch_with_a_reason(client_for, run):
    client = client_for("oncall")
    page = client.get(reverse("home"))
    token = page.cookies["csrftoken"].value

    response = client.post(
        reverse("runs:kill_switch"),
        {"on": "1", "reason": "INC-7 primary overloaded", "csrfmiddlewaretoken": token},
        follow=True,
    )

    assert KillSwitch.is_on()
    assert "Global kill switch is ON" in response.content.decode()
    action = OperatorAction.objects.get(action="kill_switch.on")
    assert (action.actor, action.reason) == ("oscar", "INC-7 primary overloaded")


def test_the_kill_switch_needs_a_reason(client_for, run):
    client = client_for("oncall")
    token = client.get(reverse("home")).cookies["csrftoken"].value

    response = client.post(
        reverse("runs:kill_switch"),
        {"on": "1", "reason": " ", "csrfmiddlewaretoken": token},
        follow=True,
    )

    assert not KillSwitch.is_on()
    assert "needs a reason" in response.content.decode()


def test_the_overview_queries_do_not_grow_with_the_number_of_policies(
    client_for, run, make_user, monkeypatch
):
    """Apart from the per-policy guard and forecast interfaces (stubbed here), the overview
    reads everything with grouped queries: no query per policy, run or chunk."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs import forecast
    from runs.engine import guard

    monkeypatch.setattr(forecast, "drain_window", lambda policy, **kw: {"verdict": "unknown"})
    monkeypatch.setattr(guard, "current_state", lambda policy, **kw: {"level": "ok", "reasons": []})
    client = client_for("viewer")
    client.get(reverse("home"))

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(reverse("home"), HTTP_HX_REQUEST="true").status_code == 200
        return len(ctx.captured_queries)

    one_policy = count()
    make_dead_letter(make_user, slug="gone", rows=200)
    make_dead_letter(make_user, slug="gone2", rows=200)
    three_policies = count()

    # progress: + per-tenant rows of cross-tenant chunks; + the account's seal (force_login keeps
    # the session on axes' backend, whose get_user loads the user alone; a real sign-in's
    # core.seals.SealedModelBackend loads the seal with the user); + every policy's approved
    # version and the latest guard sample, read once for the guard (before: once per policy);
    # + the remembered audit sums (runs.progress.audit_tallies: the cache entries, a check that
    # their last record is still there, the records since, the last ten minutes' rows);
    # + every drain window's cached measurement and every table's probe window, read once for
    # all policies (before: once per policy; the SLOs come with the approved versions)
    assert three_policies == one_policy <= 21
