"""A control posted from a page rendered for an older state is refused with the current
state shown; it never silently overwrites a newer decision. The run's controls live in the
refreshed part of its page, so they follow its state."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from core.models import OperatorAction
from retention.models import KillSwitch
from runs.actions import pause_run, resume_run, set_kill_switch
from runs.engine import worker
from runs.models import Run

from .helpers import post

pytestmark = pytest.mark.django_db


def expected_in(html: str, action_url: str) -> str:
    """The decision token the form posting to ``action_url`` was rendered with."""
    form = re.search(rf'<form[^>]*action="{re.escape(action_url)}".*?</form>', html, re.S)
    assert form, f"no form for {action_url}"
    return re.search(r'name="expected" value="([^"]+)"', form.group(0)).group(1)


def test_a_stale_resume_does_not_undo_a_newer_pause(client_for, run, users, make_user):
    page = reverse("runs:detail", args=[run.pk])
    pause_run(run, actor=users["oncall"], reason="INC-1 replica lag")
    client = client_for("oncall")
    stale = expected_in(client.get(page).content.decode(), reverse("runs:resume", args=[run.pk]))
    other = make_user("olga", "oncall")  # meanwhile, in another tab: resumed, then paused again
    resume_run(run, actor=other, reason="INC-1 over")
    pause_run(run, actor=other, reason="INC-2 primary CPU")

    response = post(
        client,
        reverse("runs:resume", args=[run.pk]),
        {"reason": "INC-1 over", "expected": stale},
        page=page,
    )

    run.refresh_from_db()
    assert run.state == Run.State.PAUSED
    assert "INC-2 primary CPU" in run.state_reason
    html = response.content.decode()
    assert "changed since the page was loaded" in html
    assert "paused by olga: INC-2 primary CPU" in html
    # the message names the run once: "Resume run … refused: changed since …", not "… it …"
    assert f"Resume run {run.run_key} refused: changed since the page was loaded" in html
    assert not OperatorAction.objects.filter(action="run.resume", actor="oscar").exists()


def test_resume_from_a_tab_loaded_while_paused_is_refused_after_the_run_drained(
    client_for, run, users, make_user
):
    page = reverse("runs:detail", args=[run.pk])
    resume_url = reverse("runs:resume", args=[run.pk])
    pause_run(run, actor=users["oncall"], reason="INC-1")
    client = client_for("oncall")
    stale = expected_in(client.get(page).content.decode(), resume_url)
    # the refreshed part carries the controls for the current state
    assert expected_in(client.get(page, HTTP_HX_REQUEST="true").content.decode(), resume_url)
    resume_run(run, actor=make_user("olga", "oncall"), reason="INC-1 over")
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED

    fragment = client.get(page, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="resume"' not in fragment
    assert "no control applies" in fragment
    response = post(client, resume_url, {"reason": "INC-1 over", "expected": stale}, page=page)

    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    html = response.content.decode()
    assert "changed since the page was loaded" in html
    assert "now Drained" in html or "now drained" in html


def test_a_stale_kill_switch_form_does_not_replace_the_recorded_reason(client_for, run, make_user):
    mine = client_for("oncall")
    home = mine.get(reverse("home")).content.decode()
    stale = expected_in(home, reverse("runs:kill_switch"))
    assert "Turn kill switch ON" in home
    # meanwhile someone else turns it on with their reason
    set_kill_switch(True, actor=make_user("olga", "oncall"), reason="INC-1 primary at 95% CPU")

    response = post(
        mine,
        reverse("runs:kill_switch"),
        {"on": "1", "reason": "INC-2 my own reason", "expected": stale},
    )

    switch = KillSwitch.objects.get(name="global")
    assert switch.on and switch.reason == "INC-1 primary at 95% CPU"
    assert switch.changed_by == "olga"
    html = response.content.decode()
    assert "changed since the page was loaded" in html
    assert "ON (turned on by olga: INC-1 primary at 95% CPU)" in html
    assert not OperatorAction.objects.filter(reason="INC-2 my own reason").exists()


def test_a_current_kill_switch_form_still_works(client_for, run):
    mine = client_for("oncall")
    current = expected_in(mine.get(reverse("home")).content.decode(), reverse("runs:kill_switch"))
    post(mine, reverse("runs:kill_switch"), {"on": "1", "reason": "INC-3", "expected": current})
    assert KillSwitch.objects.get(name="global").reason == "INC-3"
