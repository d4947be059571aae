"""Decisions taken on the control database bind every target: a hold placed mid-run protects
its rows on the target from the next chunk on; the kill switch stops a target's run."""

from __future__ import annotations

import pytest
from django.db import connection

from retention import actions as policy_actions
from runs.actions import set_kill_switch
from runs.engine import planner, worker
from runs.engine.worker import drain
from runs.models import AuditRecord, Run
from targets import connections as C
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db(transaction=True)


def _tenant_rows(tenant: int) -> set[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_events WHERE tenant_id = %s", [tenant])
        return {r[0] for r in cur.fetchall()}


def test_a_hold_placed_mid_run_protects_its_rows_on_the_target(fleet, make_user, act_as, no_guard):
    target = fleet[0].name
    with C.on(target):
        create_events(20000, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[target], chunking="tenant", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    with C.on(target):
        run = Run.objects.get(run_key=key)
        planner.plan(run)
        while not AuditRecord.objects.exists():  # one chunk, not the whole run
            worker.process_one(Run.objects.get(pk=run.pk))
        partial = AuditRecord.objects.count()
        assert 0 < partial
        assert Run.objects.get(pk=run.pk).state == Run.State.ACTIVE
        held_before = _tenant_rows(2)

    policy_actions.place_hold(
        actor=make_user("hilde", "compliance"), reason="subpoena", policy=policy, tenant="2"
    )
    run_cli("drain", "--until-idle")
    with C.on(target):
        assert Run.objects.get(pk=run.pk).state == Run.State.DRAINED
        assert AuditRecord.objects.count() > partial
        # not one row of tenant 2 went after the hold committed on the control database
        assert _tenant_rows(2) == held_before


def test_the_kill_switch_stops_a_targets_run(fleet, make_user, act_as, no_guard):
    target = fleet[1].name
    with C.on(target):
        create_events(1000, days=40)
    approved_policy(make_user, **events_spec(targets=[target], chunk_size=100))
    oncall = make_user("olga", "oncall")
    act_as(oncall)
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    set_kill_switch(True, actor=oncall, reason="incident")
    with C.on(target):
        stats = drain(Run.objects.get(run_key=key).pk, budget_s=5, until_idle=True)
        assert "kill switch" in stats["stopped"]
        assert not AuditRecord.objects.exists()
    set_kill_switch(False, actor=oncall, reason="resolved")
    run_cli("drain", "--until-idle")
    with C.on(target):
        assert AuditRecord.objects.exists()
        assert Run.objects.get(run_key=key).state == Run.State.DRAINED


def test_a_scheduled_firing_creates_the_run_on_each_target(fleet, make_user, no_guard):
    from runs import tasks

    for target in fleet[:2]:
        with C.on(target.name):
            create_events(300, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[fleet[0].name, fleet[1].name], chunk_size=100)
    )
    from django.utils import timezone

    outcome = tasks.trigger_scheduled(policy_id=policy.pk, tick=timezone.now().isoformat())
    assert f"created run {fleet[0].name}:events/" in outcome
    assert f"created run {fleet[1].name}:events/" in outcome
    assert not Run.objects.exists()  # none on the control database
    for target in fleet[:2]:
        with C.on(target.name):
            assert Run.objects.count() == 1
