"""A period whose run a newly approved version superseded runs again under that version —
from the reconciler (on behalf of the schedule), from a scheduled firing and from ``retention
trigger`` — and invariant 1 holds as documented: one live (not superseded) run per policy
and period, enforced by the database; each re-run names the run it replaces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from core.models import OperatorAction
from retention.models import PolicyVersion
from runs import tasks
from runs.actions import trigger_run
from runs.engine import worker
from runs.engine.reconciler import reconcile
from runs.models import Run
from tests.factories import approved_policy, events_spec

pytestmark = pytest.mark.usefixtures("no_guard")

TICK = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)  # a tick of "0 3 * * *"


@pytest.fixture
def superseded(events_policy, make_user):
    """The current period's run, active under v1, superseded by v2's approval."""
    first, _ = trigger_run(events_policy, tick=TICK)
    assert first.state == Run.State.ACTIVE
    approved_policy(make_user, **events_spec(retention="10 days"))
    first.refresh_from_db()
    assert first.state == Run.State.SUPERSEDED
    return first


def test_retention_trigger_runs_a_superseded_period_again_under_the_new_version(
    superseded, make_user, act_as
):
    act_as(make_user("otto", "oncall"))
    out = StringIO()
    call_command("retention", "trigger", "events", "--period", "2026-11-30T03:00", stdout=out)
    assert out.getvalue().strip() == "events/2026-11-30T03:00/v2"
    rerun = Run.objects.get(run_key="events/2026-11-30T03:00/v2")
    v2 = PolicyVersion.objects.get(policy=superseded.policy, number=2)
    assert rerun.policy_version == v2 and rerun.tick == superseded.tick
    assert rerun.replaces == superseded
    assert rerun.cutoff == TICK - timedelta(days=10)  # v2's retention
    assert rerun.state == Run.State.ACTIVE
    trigger = OperatorAction.objects.filter(action="run.trigger", target_id=str(rerun.pk)).get()
    assert trigger.details["replaces"] == superseded.run_key
    # duplicate triggers converge on the re-run
    again, created = trigger_run(superseded.policy, tick=TICK)
    assert (again, created) == (rerun, False)
    # one live run per policy and period, in the database
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.create(
            run_key="events/duplicate", policy=rerun.policy, policy_version=v2, tick=TICK,
            cutoff=rerun.cutoff,
        )  # fmt: skip
    assert worker.drain(rerun.pk, budget_s=60)["stopped"] == "no work left"
    rerun.refresh_from_db()
    assert rerun.state == Run.State.DRAINED, rerun.state_reason


def test_the_reconciler_runs_the_superseded_period_again_without_waiting_for_the_next_tick(
    superseded,
):
    reconcile(now=TICK + timedelta(minutes=5))
    rerun = Run.objects.exclude(pk=superseded.pk).get()
    assert rerun.tick == superseded.tick and rerun.replaces == superseded
    assert rerun.policy_version.number == 2
    assert rerun.state == Run.State.ACTIVE
    reconcile(now=TICK + timedelta(minutes=6))  # once
    assert Run.objects.count() == 2


def test_a_scheduled_firing_for_a_superseded_period_runs_it_under_the_new_version(
    superseded, monkeypatch
):
    monkeypatch.setattr(tasks, "_now", lambda: TICK + timedelta(seconds=30))  # a redelivery
    outcome = tasks.trigger_scheduled(policy_id=superseded.policy_id, tick=TICK.isoformat())
    assert "created run events/2026-11-30T03:00/v2" in outcome, outcome


def test_a_period_that_drained_is_not_run_again_after_a_new_approval(events_policy, make_user):
    first, _ = trigger_run(events_policy, tick=TICK)
    worker.drain(first.pk, budget_s=60)
    first.refresh_from_db()
    assert first.state == Run.State.DRAINED
    approved_policy(make_user, **events_spec(retention="10 days"))
    assert trigger_run(events_policy, tick=TICK) == (first, False)
    reconcile(now=TICK + timedelta(minutes=5))
    assert Run.objects.count() == 1
