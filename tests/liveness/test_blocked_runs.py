"""Every path that starts a run goes through admission, and no blocked run blocks for ever."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.models import OperatorAction
from retention.actions import pause_policy
from runs.actions import cancel_run, trigger_run
from runs.engine.reconciler import reconcile
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW

DAY = timedelta(days=1)


def burst(events_policy, rows: int | None = None) -> None:
    """Old rows arrive after approval: more than the blast radius allows."""
    baseline = events_policy.approved_version.preview["eligible"]
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_events SELECT 100000 + g, 2, %s, 'closed', 'x'"
            " FROM generate_series(1, %s) AS g",
            [NOW - timedelta(days=30), rows or max(10_001, baseline * 4)],
        )


def state(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def test_a_run_that_waited_passes_the_blast_radius_check_when_it_starts(events_policy, make_user):
    burst(events_policy)
    held, _ = trigger_run(events_policy, tick=NOW - DAY)
    assert held.state == Run.State.CONFIRM
    waiting, _ = trigger_run(events_policy, tick=NOW)
    assert state(waiting) == Run.State.WAITING
    cancel_run(held, actor=make_user("oscar", "oncall"), reason="too big, not expected")
    waiting.refresh_from_db()
    assert waiting.state == Run.State.CONFIRM, waiting.state_reason
    assert waiting.expected_rows is not None


def test_a_paused_policys_ticks_are_recorded_as_skipped_not_queued(events_policy, make_user):
    pause_policy(events_policy, actor=make_user("oscar", "oncall"), reason="maintenance")
    runs = [trigger_run(events_policy, tick=NOW + n * DAY)[0] for n in range(3)]
    assert [r.state for r in runs] == [Run.State.SKIPPED] * 3
    assert all("paused" in r.state_reason for r in runs)
    assert not Run.objects.filter(state__in=Run.OPEN).exists()


def test_at_most_one_run_waits_and_newer_ticks_fold_into_it(events_policy):
    first, _ = trigger_run(events_policy, tick=NOW)
    assert first.state == Run.State.ACTIVE
    later = [trigger_run(events_policy, tick=NOW + n * DAY)[0] for n in (1, 2, 3)]
    waiting = Run.objects.filter(state=Run.State.WAITING)
    assert list(waiting.values_list("pk", flat=True)) == [later[-1].pk]
    keeper = waiting.get()
    assert sorted(keeper.skipped_ticks) == sorted(r.tick.isoformat() for r in later[:-1])
    for run in later[:-1]:
        assert state(run) == Run.State.SKIPPED
        assert run.state_reason.startswith("folded into")
    assert OperatorAction.objects.filter(action="run.fold").count() == 2


def test_approving_a_version_supersedes_the_old_versions_open_runs(events_policy, make_user):
    stuck, _ = trigger_run(events_policy, tick=NOW)
    Run.objects.filter(pk=stuck.pk).update(state=Run.State.ATTENTION, state_reason="stuck")
    behind, _ = trigger_run(events_policy, tick=NOW + DAY)
    assert state(behind) == Run.State.WAITING
    approved_policy(make_user, **events_spec(retention="25 days"))
    assert state(stuck) == Run.State.SUPERSEDED
    assert state(behind) == Run.State.SUPERSEDED
    assert OperatorAction.objects.filter(action="run.supersede").count() == 2
    # the new version's next tick is not blocked by anything
    fresh, _ = trigger_run(events_policy, tick=NOW + 2 * DAY)
    assert fresh.state == Run.State.ACTIVE


def test_a_run_held_for_confirmation_expires_into_a_visible_terminal_state(events_policy, settings):
    settings.RETENTION = {**settings.RETENTION, "CONFIRM_EXPIRY_S": 3600}
    burst(events_policy)
    held, _ = trigger_run(events_policy, tick=NOW)
    assert held.state == Run.State.CONFIRM
    report = reconcile(now=timezone.now() + timedelta(minutes=30))
    assert state(held) == Run.State.CONFIRM, report
    report = reconcile(now=timezone.now() + timedelta(hours=2))
    assert state(held) == Run.State.EXPIRED, report
    assert "not confirmed within 1 h" in held.state_reason
    assert held.is_terminal
    assert OperatorAction.objects.filter(action="run.expire", target_id=str(held.pk)).exists()


@pytest.fixture(autouse=True)
def _events(events):  # the events table for every test here
    yield
