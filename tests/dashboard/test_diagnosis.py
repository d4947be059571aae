"""One diagnosis of why a run deletes nothing, read from the same function by
``retention status``, the run page, its drain-window line and the overview card
(``runs.status.health_of``)."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from retention.actions import pause_policy
from runs.actions import set_kill_switch
from runs.forecast import drain_window
from runs.models import Run
from runs.status import run_status

pytestmark = pytest.mark.django_db

SWITCH = "the global kill switch is on"


def _status_json(run) -> dict:
    from io import StringIO

    out = StringIO()
    call_command("retention", "status", run.run_key, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_with_the_kill_switch_on_every_surface_says_the_switch_stops_the_run(
    client_for, run, users
):
    set_kill_switch(True, actor=users["oncall"], reason="INC-52 primary at 95% CPU")

    status = _status_json(run)
    assert status["health"] == "stopped"
    assert SWITCH in status["waiting_reason"]
    assert "INC-52 primary at 95% CPU" in status["waiting_reason"]
    assert "until it is turned off" in status["waiting_reason"]
    assert "no worker alive" not in status["waiting_reason"]
    window = status["drain_window"]["explanation"]
    assert window.startswith(SWITCH), window
    assert "until it goes on" not in window

    page = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert f'stopped <span class="small">{status["waiting_reason"]}' in page
    assert "until it goes on" not in page
    card = client_for("viewer").get(reverse("home")).content.decode()
    assert f'data-testid="card-health">stopped: {status["waiting_reason"]}<' in card
    assert "until it goes on" not in card


def test_the_switch_turned_off_gives_the_run_back_its_own_health(run, users):
    set_kill_switch(True, actor=users["oncall"], reason="INC-52")
    set_kill_switch(False, actor=users["oncall"], reason="INC-52 over")
    status = run_status(run)
    assert status["health"] != "stopped"
    assert SWITCH not in status["waiting_reason"]


def test_a_paused_policy_is_said_to_wait_for_its_resume(run, users):
    pause_policy(run.policy, actor=users["oncall"], reason="INC-60 replica lag")
    run = Run.objects.select_related("policy").get(pk=run.pk)
    status = run_status(run)
    assert status["health"] == "paused"
    assert status["waiting_reason"].startswith(f"policy {run.policy.slug} is paused")
    assert "until it is resumed" in status["waiting_reason"]
    window = drain_window(run.policy, fresh=True)
    assert window["verdict"] == "paused"
    assert window["explanation"].startswith(status["waiting_reason"])
