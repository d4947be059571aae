from __future__ import annotations

import pytest
from django.urls import reverse

from core.models import OperatorAction
from retention.actions import place_hold
from runs.actions import trigger_run
from runs.models import AuditRecord, Run
from runs.pages import contexts as pages
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events

from .helpers import post

pytestmark = pytest.mark.django_db


def test_the_run_page_shows_window_version_progress_and_last_commit(client_for, run):
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()

    last = AuditRecord.objects.filter(run=run).order_by("-chain_seq").first()
    assert run.cutoff.strftime("%Y-%m-%d %H:%M:%S") in html
    assert run.tick.strftime("%Y-%m-%d %H:%M:%S") in html
    assert reverse("retention:policy_detail", args=["events"]) in html
    assert f"events v{run.policy_version.number}" in html
    assert f"#{last.chunk_id}" in html and f"audit #{last.chain_seq}" in html
    assert 'data-testid="histogram"' in html and "<svg" in html
    assert 'data-testid="rate-chart"' in html
    assert "<script" not in html.split("<body")[1]  # charts are server-rendered SVG


def test_the_histogram_counts_chunks_by_state(client_for, run):
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()

    done = run.chunks.filter(state="done").count()
    pending = run.chunks.filter(state="pending").count()
    assert f"<title>done: {done}</title>" in html
    assert f"<title>pending: {pending}</title>" in html


def test_per_tenant_progress_lists_every_tenant(client_for, run):
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()

    for tenant in run.chunks.values_list("tenant", flat=True).distinct():
        assert f'data-tenant="{tenant}"' in html


def test_an_htmx_request_gets_only_the_live_part(client_for, run):
    response = client_for("viewer").get(
        reverse("runs:detail", args=[run.pk]), HTTP_HX_REQUEST="true"
    )

    html = response.content.decode()
    assert "<html" not in html
    assert 'data-testid="schedule-window"' in html
    assert 'id="run-controls"' not in html


def test_oncall_pauses_and_resumes_the_same_run(client_for, run):
    client = client_for("oncall")
    page = reverse("runs:detail", args=[run.pk])

    response = post(client, reverse("runs:pause", args=[run.pk]), {"reason": "INC-9"}, page=page)
    assert response.redirect_chain[-1][0] == page
    run.refresh_from_db()
    assert run.state == Run.State.PAUSED
    assert "Pause run" in response.content.decode()

    post(client, reverse("runs:resume", args=[run.pk]), {"reason": "INC-9 resolved"}, page=page)
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE
    assert list(
        OperatorAction.objects.filter(target_id=str(run.pk), actor="oscar")
        .order_by("at")
        .values_list("action", "reason")
    ) == [("run.pause", "INC-9"), ("run.resume", "INC-9 resolved")]


def test_a_refused_action_shows_the_reason_why(client_for, run):
    client = client_for("oncall")
    page = reverse("runs:detail", args=[run.pk])

    response = post(client, reverse("runs:resume", args=[run.pk]), {"reason": "go"}, page=page)

    html = response.content.decode()
    assert "msg-error" in html
    assert "only a paused run or one needing attention can resume" in html
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


def test_an_action_without_a_reason_is_refused(client_for, run):
    client = client_for("oncall")
    page = reverse("runs:detail", args=[run.pk])

    response = post(client, reverse("runs:pause", args=[run.pk]), {"reason": ""}, page=page)

    assert "needs a reason" in response.content.decode()
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


def test_oncall_cancels_a_run(client_for, run):
    client = client_for("oncall")
    post(client, reverse("runs:cancel", args=[run.pk]), {"reason": "wrong table"})

    run.refresh_from_db()
    assert run.state == Run.State.CANCELLED
    assert not run.chunks.filter(state="pending").exists()


def test_a_viewer_sees_no_controls_and_cannot_post_them(client_for, run):
    client = client_for("viewer")
    html = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert 'id="run-controls"' not in html

    response = post(client, reverse("runs:pause", args=[run.pk]), {"reason": "x"}, follow=False)

    assert response.status_code == 403
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


def test_the_run_list_filters_by_policy_and_state(client_for, run):
    client = client_for("viewer")
    assert run.run_key in client.get(reverse("runs:list") + "?policy=events").content.decode()
    assert run.run_key not in client.get(reverse("runs:list") + "?state=drained").content.decode()


def test_the_run_list_searches_by_run_key_and_shows_duration(client_for, run, make_user):
    from runs.actions import trigger_run
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    create_events(300, name="rr_other")
    other = approved_policy(make_user, **events_spec(slug="other", table="rr_other"))
    other_run, _ = trigger_run(other, tick=NOW)
    client = client_for("viewer")

    found = client.get(reverse("runs:list"), {"q": "events/2026"}).content.decode()
    assert run.run_key in found and other_run.run_key not in found
    assert 'name="q"' in found and 'value="events/2026"' in found
    assert "<th>Duration</th>" in found
    none = client.get(reverse("runs:list"), {"q": "no-such-key"}).content.decode()
    assert "No run matches." in none


def test_oncall_starts_a_run_for_a_period_from_the_policy_page(client_for, events_policy):
    from runs.actions import run_key_for

    client = client_for("oncall")
    page = reverse("retention:policy_detail", args=["events"])
    assert 'data-testid="trigger"' in client.get(page).content.decode()
    url = reverse("runs:trigger")

    first = post(client, url, {"policy": "events", "period": "2026-11-20"}, page=page)
    run = Run.objects.get(policy=events_policy)
    assert run.source == "manual" and run.created_by == "oscar"
    assert run.run_key == run_key_for(events_policy, run.tick)
    assert first.redirect_chain[-1][0] == reverse("runs:detail", args=[run.pk])
    again = post(client, url, {"policy": "events", "period": "2026-11-20"}, page=page)
    assert Run.objects.filter(policy=events_policy).count() == 1
    assert "already existed" in again.content.decode()

    for bad in ("20-11-2026", "2999-01-01"):
        refused = post(client, url, {"policy": "events", "period": bad}, page=page)
        assert "Trigger refused" in refused.content.decode()
    assert Run.objects.filter(policy=events_policy).count() == 1


def test_the_run_page_counts_rows_deferred_by_holds_per_tenant(client_for, run, make_user):
    carla = make_user("hilda", "compliance")
    place_hold(policy=run.policy, tenant="3", actor=carla, reason="case 7")
    place_hold(tenant="1", key_from=1000, key_to=1400, actor=carla, reason="case 8")

    html = client_for("oncall").get(reverse("runs:detail", args=[run.pk])).content.decode()

    eligible = "occurred_at < %s AND status <> 'disputed'"
    three = count("public.rr_events", f"{eligible} AND tenant_id = 3", [run.cutoff])
    one = count(
        "public.rr_events",
        f"{eligible} AND tenant_id = 1 AND id >= 1000 AND id < 1400",
        [run.cutoff],
    )
    assert three > 0 and one > 0
    assert f'<tr data-held-tenant="3"><td>3</td><td class="num">{three:,}</td></tr>' in html
    assert f'<tr data-held-tenant="1"><td>1</td><td class="num">{one:,}</td></tr>' in html
    assert html.count("data-held-tenant=") == 2  # tenants no hold covers are not listed


def test_the_run_page_says_when_no_row_of_the_run_is_held(client_for, run, make_user):
    place_hold(tenant="99", actor=make_user("hilda", "compliance"), reason="case 9")

    html = client_for("oncall").get(reverse("runs:detail", args=[run.pk])).content.decode()

    assert "data-held-tenant=" not in html
    assert 'data-testid="held-none"' in html


def test_the_per_tenant_held_count_says_not_counted_when_it_runs_out_of_time(
    db, make_user, client_for, monkeypatch
):
    create_events(200_000, name="rr_big")
    policy = approved_policy(make_user, **events_spec(slug="big", table="rr_big"))
    created, _ = trigger_run(policy, tick=NOW)
    place_hold(tenant="1", actor=make_user("hilda", "compliance"), reason="case 10")
    monkeypatch.setattr(pages, "HELD_COUNT_TIMEOUT_MS", 1)  # a 200k-row scan takes longer

    page = client_for("oncall").get(reverse("runs:detail", args=[created.pk]))

    html = page.content.decode()
    assert page.status_code == 200
    assert "Deferred rows per tenant: not counted (timeout)." in html
    assert "data-held-tenant=" not in html


@pytest.mark.parametrize("stop", ["run", "policy", "kill switch"])
def test_a_stopped_run_has_no_admissible_chunk(client_for, run, users, stop):
    from retention.actions import pause_policy
    from runs.actions import pause_run, set_kill_switch
    from runs.status import run_status

    if stop == "run":
        pause_run(run, actor=users["oncall"], reason="INC-5 replica lag")
    elif stop == "policy":
        pause_policy(run.policy, actor=users["oncall"], reason="INC-5 replica lag")
    else:
        set_kill_switch(True, actor=users["oncall"], reason="INC-5 replica lag")
    pending = run.chunks.filter(state="pending").count()
    assert pending > 0

    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert f"{pending} pending chunk(s), none admissible now" in html
    assert run_status(Run.objects.get(pk=run.pk))["admissible"] == 0
