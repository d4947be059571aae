"""The overview's figures say what they mean: backlog age is how far behind the policy is
(the oldest eligible row's age minus the retention), with the oldest row's age as a detail;
a policy whose runs the kill switch stops is not "active" in green."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.utils import timezone

from core.formatting import duration
from runs.actions import set_kill_switch

pytestmark = pytest.mark.django_db


def card(client) -> str:
    html = client.get("/?policy=events").content.decode()
    return html[html.index('data-policy="events"') :]


def test_backlog_age_is_how_far_behind_the_policy_is(client_for, run, events_policy):
    spec = events_policy.approved_version.parsed
    now = timezone.now()
    cutoff = spec.cutoff_for(now)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT min(occurred_at) FROM public.rr_events WHERE occurred_at < %s"
            " AND (status = 'disputed') IS FALSE",
            [cutoff],
        )
        oldest = cur.fetchone()[0]
    html = card(client_for("viewer"))
    age = re.search(r'data-testid="backlog-age">([^<]*)<', html).group(1)
    behind = round((cutoff - oldest).total_seconds())
    assert age.strip() == f"{duration(behind)} behind"
    detail = re.search(r'data-testid="oldest-age">([^<]*)<', html).group(1)
    assert detail == f"oldest eligible row {duration(round((now - oldest).total_seconds()))} old"


def test_a_card_says_stopped_by_the_kill_switch(client_for, run, users):
    assert ">active</span>" in card(client_for("viewer"))
    set_kill_switch(True, actor=users["oncall"], reason="INC-4")
    html = card(client_for("viewer"))
    assert 'data-testid="policy-state">stopped by the kill switch<' in html
    # the run, on its page and in the list of runs, is not simply "active" either
    said = 'data-testid="run-state">Active · stopped by the kill switch<'
    for url in (f"/runs/{run.pk}/", "/runs/"):
        assert said in client_for("viewer").get(url).content.decode(), url


def test_the_guard_badge_is_calm_once_the_controllers_last_step_is_old(client_for, run):
    from datetime import timedelta

    from runs.engine import guard
    from runs.models import GuardControl, GuardSample

    GuardSample.objects.create(
        taken_at=timezone.now(),
        values={"lock_waits": 0, "connections_free": 100},
        tables={"public.rr_events": {"probe_ms": 1.0, "in_flight": True, "dead_tuple_ratio": 0.0}},
    )
    control = GuardControl.objects.create(
        policy_id=run.policy_id, concurrency=1, chunk_ms=50, duty_cycle=0.1,
        stepped_at=timezone.now(), probe_p99_ms=10.0, baseline_ms=2.0, inflation=5.0,
        budget=1.5, limit_ms=3.0, action=guard.FLOOR, reason="over the budget at its minimum",
    )  # fmt: skip
    state = guard.current_state(run.policy)
    assert state["level"] == "throttled" and state["latency"]["over"]
    assert 'data-testid="guard-latency">probe p99 10 ms, limit 3 ms' in card(client_for("viewer"))

    # the run drained an hour ago: its last step judged a foreground no run loads now
    GuardControl.objects.filter(pk=control.pk).update(
        stepped_at=timezone.now() - timedelta(hours=1)
    )
    state = guard.current_state(run.policy)
    assert (state["level"], state["latency"]) == ("ok", None), state["reasons"]
    assert 'data-testid="guard-latency"' not in card(client_for("viewer"))
