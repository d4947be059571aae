"""The guard as on-call reads it in headless Chromium, on the overview's card and the run
page: the badge follows the same verdict as the reason beside it (never "ok" beside a
latency over its limit), one latency measure in ms; once the controller's step is old (the
run drained) the badge is calm again; with the kill switch on, the card and the run say
"stopped by the kill switch", not "active". Each change reaches the open pages by their
refresh, without a reload."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.actions import set_kill_switch
from runs.engine import guard
from runs.models import GuardControl, GuardSample
from tests.browser import beats, open_on_a_clock
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures
from tests.dashboard.test_browser_axe import violations
from tests.dashboard.test_browser_run_controls import watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REASON = (
    "over the budget at the controller's minimum (1 chunk transaction at once, 50 ms chunks,"
    " duty cycle 10%): probe p99 10 ms > limit 3 ms"
)


def test_the_badge_the_latency_and_the_kill_switch_say_one_thing(
    login,  # noqa: F811
    live_server,
    active_run,  # noqa: F811
    users,
    settings,
):
    # a control period long enough that the step below stays recent however slow the pages
    settings.RETENTION = {**settings.RETENTION, "GUARD_CONTROL_PERIOD_MS": 60_000}
    GuardSample.objects.create(
        taken_at=timezone.now(),
        values={"lock_waits": 0, "connections_free": 100},
        tables={"public.rr_events": {"probe_ms": 1.0, "in_flight": True, "dead_tuple_ratio": 0.0}},
    )
    GuardControl.objects.update_or_create(
        policy_id=active_run.policy_id,
        defaults=dict(
            concurrency=1, chunk_ms=50, duty_cycle=0.1, stepped_at=timezone.now(),
            probe_p99_ms=10.0, baseline_ms=2.0, inflation=5.0, budget=1.5, limit_ms=3.0,
            action=guard.FLOOR, reason=REASON,
        ),
    )  # fmt: skip
    overview = login("oncall")
    errors = watch_console(overview)
    open_on_a_clock(overview, f"{live_server.url}/?policy=events")
    card = overview.locator('[data-policy="events"]')
    run_page = login("viewer")
    open_on_a_clock(run_page, f"{live_server.url}/runs/{active_run.pk}/")

    for page, where in ((card, "card"), (run_page.locator("#run-live"), "run page")):
        badge = page.locator(".badge.throttled")
        expect(badge, where).to_have_count(1)
        latency = page.get_by_test_id("guard-latency")
        expect(latency, where).to_have_count(1)  # one latency measure, in ms
        expect(latency, where).to_contain_text("probe p99 10 ms, limit 3 ms")
        expect(page.locator(".badge.ok"), where).to_have_count(0)
    # the run page with the guard's signals table: every column headed
    assert violations(run_page) == []

    # the controller's last step an hour old: the run drained long ago, nothing throttles now
    GuardControl.objects.filter(policy_id=active_run.policy_id).update(
        stepped_at=timezone.now() - timedelta(hours=1)
    )
    beats(overview, 1)
    beats(run_page, 1)
    expect(card.locator(".badge.throttled")).to_have_count(0)
    expect(card.get_by_test_id("guard-latency")).to_have_count(0)
    expect(run_page.locator("#run-live .badge.throttled")).to_have_count(0)

    expect(card.get_by_test_id("policy-state")).to_have_text("active")
    set_kill_switch(True, actor=users["oncall"], reason="INC-60 primary failover")
    beats(overview, 1)
    beats(run_page, 1)
    expect(card.get_by_test_id("policy-state")).to_have_text("stopped by the kill switch")
    expect(run_page.get_by_test_id("run-state")).to_have_text("Active · stopped by the kill switch")
    assert errors == []
