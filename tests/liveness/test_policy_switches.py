"""Enabling, disabling, pausing and resuming a policy, and its schedule's integrity."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from core.models import OperatorAction
from retention.actions import ActionError, pause_policy, resume_policy, set_policy_enabled
from retention.models import Policy
from retention.schedule_math import next_tick
from retention.spec import PolicySpec, SpecError
from runs import tasks
from runs.actions import ActionError as RunActionError
from runs.actions import trigger_run
from runs.engine import schedules
from runs.models import Lease, Run
from tests.factories import events_spec
from tests.runs.conftest import NOW


def armed(policy):
    return Schedule.objects.filter(name=schedules.schedule_name(policy)).first()


def test_schedule_names_are_unique(db):
    Schedule.objects.create(name="retention:trigger:x", func="runs.tasks.trigger_scheduled")
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.create(name="retention:trigger:x", func="runs.tasks.trigger_scheduled")


def test_disabling_and_enabling_a_policy_is_an_action_its_schedule_follows(
    events_policy, make_user
):
    oncall = make_user("oscar", "oncall")
    set_policy_enabled(events_policy, False, actor=oncall, reason="table being migrated")
    assert armed(events_policy) is None
    with pytest.raises(RunActionError, match="disabled"):
        trigger_run(Policy.objects.get(pk=events_policy.pk), tick=NOW)
    with pytest.raises(ActionError, match="already disabled"):
        set_policy_enabled(events_policy, False, actor=oncall, reason="again")
    set_policy_enabled(events_policy, True, actor=oncall, reason="migration done")
    assert armed(events_policy).next_run == next_tick(events_policy, timezone.now())
    assert list(
        OperatorAction.objects.filter(target_type="policy", action__startswith="policy.e")
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["policy.enable"]
    assert OperatorAction.objects.filter(action="policy.disable").count() == 1


def test_a_firing_that_finds_the_policy_disabled_keeps_its_schedule(events_policy, monkeypatch):
    Policy.objects.filter(pk=events_policy.pk).update(enabled=False)  # flipped in the database
    tick = armed(events_policy).next_run
    monkeypatch.setattr(tasks, "_now", lambda: tick + timedelta(seconds=20))
    outcome = tasks.trigger_scheduled(policy_id=events_policy.pk, tick=tick.isoformat())
    assert "disabled" in outcome
    assert not Run.objects.exists()
    schedule = armed(events_policy)
    assert schedule is not None and schedule.repeats == 1 and schedule.next_run > tick


def test_a_cron_expression_that_names_no_date_is_refused_at_validation():
    with pytest.raises(SpecError, match="never fires"):
        PolicySpec.parse(events_spec(schedule="0 2 30 2 *"))
    assert PolicySpec.parse(events_spec(schedule="0 2 29 2 *")).schedule == "0 2 29 2 *"


def test_resuming_a_policy_republishes_its_leases_at_once(events_policy, make_user):
    oncall = make_user("oscar", "oncall")
    run, _ = trigger_run(events_policy, tick=NOW)
    pause_policy(events_policy, actor=oncall, reason="maintenance")
    OrmQ.objects.all().delete()  # the leases ended on "policy is paused"
    before = dict(Lease.objects.filter(run=run).values_list("slot", "generation"))
    resume_policy(events_policy, actor=oncall, reason="done")
    after = dict(Lease.objects.filter(run=run).values_list("slot", "generation"))
    assert OrmQ.objects.count() == 2
    assert all(after[slot] == before[slot] + 1 for slot in before)


def test_one_policys_reconciler_error_does_not_stop_anothers_waiting_run(make_user, monkeypatch):
    from runs.engine import reconciler
    from tests.liveness.conftest import drop_tables, policy_on

    alpha = policy_on(make_user, "alpha", "rr_alpha")
    beta = policy_on(make_user, "beta", "rr_beta")
    waiting = []
    for policy in (alpha, beta):
        first, _ = trigger_run(policy, tick=NOW)
        second, _ = trigger_run(policy, tick=NOW + timedelta(days=1))
        Run.objects.filter(pk=first.pk).update(state=Run.State.CANCELLED)  # ended, no follow-up
        waiting.append(second)
    real = reconciler.start_waiting_runs

    def broken_for_alpha(policy, **kwargs):
        if policy.slug == "alpha":
            raise RuntimeError("alpha is broken")
        return real(policy, **kwargs)

    monkeypatch.setattr(reconciler, "start_waiting_runs", broken_for_alpha)
    try:
        report = reconciler.reconcile()
        assert ("alpha", "alpha is broken") in report["failed"]
        waiting[1].refresh_from_db()
        assert waiting[1].state == Run.State.ACTIVE
    finally:
        drop_tables("rr_alpha", "rr_beta")


def test_the_cli_disables_and_enables_a_policy(events_policy, make_user, act_as):
    from io import StringIO

    from django.core.management import call_command

    act_as(make_user("oscar", "oncall"))
    out = StringIO()
    call_command("retention", "policy", "disable", "events", "--reason", "migrating", stdout=out)
    assert "policy events disabled" in out.getvalue()
    assert armed(events_policy) is None
    call_command("retention", "policy", "enable", "events", "--reason", "done", stdout=out)
    assert armed(events_policy) is not None
    assert Policy.objects.get(pk=events_policy.pk).enabled
