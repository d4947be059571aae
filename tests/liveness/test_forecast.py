"""The drain-window forecast's inflow counts only rows that will become eligible."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from retention.actions import place_hold
from runs.forecast import drain_window
from tests.runs.conftest import count


def test_inflow_counts_rows_that_become_eligible_not_kept_or_held_ones(events_policy, make_user):
    spec = events_policy.approved_version.parsed
    now = timezone.now()
    start, end = spec.cutoff_for(now), spec.cutoff_for(now + timedelta(days=1))
    not_kept = count(
        "rr_events", "occurred_at >= %s AND occurred_at < %s AND status <> 'disputed'", [start, end]
    )
    everything = count("rr_events", "occurred_at >= %s AND occurred_at < %s", [start, end])
    assert 0 < not_kept < everything
    inflow = drain_window(events_policy, fresh=True)["inflow_per_day"]
    assert abs(inflow - not_kept) <= not_kept // 50 + 2  # rows near the edges move as time does
    place_hold(policy=events_policy, actor=make_user("hilda", "compliance"), reason="litigation")
    assert drain_window(events_policy, fresh=True)["inflow_per_day"] == 0
