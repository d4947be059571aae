from __future__ import annotations

import pytest

from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, Run
from tests.runs.conftest import NOW, count

# not about the guard: the worker's chunks commit whatever a busy machine does to its probe
pytestmark = pytest.mark.usefixtures("no_guard")


def drain_inline(run: Run) -> dict:
    return worker.drain(run.pk, budget_s=60)


def test_a_run_drains_every_eligible_row_and_nothing_else(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    before_total = count("rr_events")
    stats = drain_inline(run)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert stats["rows"] > 0
    assert count("rr_events") == before_total - stats["rows"]
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []
    # kept rows older than the cutoff survive
    assert count("rr_events", "occurred_at < %s AND status = 'disputed'", [run.cutoff]) > 0


def test_each_finished_chunk_has_exactly_one_audit_row(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    drain_inline(run)
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert done > 1
    assert AuditRecord.objects.filter(run=run).count() == done


def test_replaying_a_committed_chunk_changes_nothing(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    outcome = worker.process_one(run)
    assert outcome.kind == worker.DONE
    rows_after = count("rr_events")
    again = worker.process_one(run, chunk_id=outcome.chunk_id)
    assert again.kind == worker.NO_WORK
    assert count("rr_events") == rows_after
    assert AuditRecord.objects.filter(chunk_id=outcome.chunk_id).count() == 1


def test_a_paused_run_admits_no_chunk(events_policy, make_user):
    from runs.actions import pause_run

    oncall = make_user("oscar", "oncall")
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    pause_run(run, actor=oncall, reason="incident")
    run.refresh_from_db()
    outcome = worker.process_one(run)
    assert outcome.kind == worker.STOP
    assert "paused" in outcome.reason
    assert AuditRecord.objects.count() == 0


def test_a_superseded_version_is_refused_before_mutating(events_policy, make_user):
    from tests.factories import approved_policy

    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    before = count("rr_events")
    spec = dict(events_policy.approved_version.spec)
    approved_policy(
        make_user, slug="events", table="public.rr_events", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="25 days", schedule="0 3 * * *", chunk_size=spec["chunk_size"],
    )  # fmt: skip
    # the approval superseded the run and cancelled its pending chunks: nothing to claim
    outcome = worker.process_one(run)
    run.refresh_from_db()
    assert outcome.kind in (worker.STOP, worker.NO_WORK)
    assert run.state == Run.State.SUPERSEDED
    assert not run.chunks.filter(state="pending").exists()
    assert count("rr_events") == before
    # the supersede is an action like any other state change: exactly one operator-log row
    # (written by the approval, or by the worker when it finds the approval moved on)
    from core.models import OperatorAction

    rows = OperatorAction.objects.filter(action="run.supersede", target_id=str(run.pk))
    assert rows.count() == 1


@pytest.mark.parametrize("state", ["on"])
def test_the_global_kill_switch_stops_admission(events_policy, make_user, state):
    from runs.actions import set_kill_switch

    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    set_kill_switch(True, actor=make_user("oscar", "oncall"), reason="drill")
    outcome = worker.process_one(run)
    assert outcome.kind == worker.STOP
    assert "kill switch" in outcome.reason


def test_status_tells_throttled_from_stuck(events_policy):
    from datetime import timedelta

    from django.utils import timezone

    from runs.status import run_status

    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    assert run_status(run)["health"] == "starting"  # nothing committed yet, just started
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    run.refresh_from_db()
    assert run_status(run)["health"] == "stuck"  # pending work, no commit for ten minutes
    chunk = Chunk.objects.filter(run=run).first()
    Chunk.objects.filter(pk=chunk.pk).update(
        not_before=timezone.now() + timedelta(minutes=5), throttle_reason="lock waits 14 > 10"
    )
    status = run_status(run)
    assert status["health"] == "throttled"
    assert status["throttle_reason"] == "lock waits 14 > 10"


def test_drain_until_idle_returns_when_nothing_is_admissible_while_a_lease_waits_out_its_budget(
    events_policy,
):
    from datetime import timedelta

    from django.utils import timezone

    run, _ = trigger_run(events_policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    Chunk.objects.filter(run=run).update(not_before=timezone.now() + timedelta(hours=1))
    idle = worker.drain(run.pk, budget_s=5, until_idle=True)
    assert idle["stopped"].startswith("idle"), idle
    assert (idle["chunks"], idle["continue"]) == (0, True)
    lease = worker.drain(run.pk, budget_s=1)  # a lease keeps its slot until its budget ends
    assert (lease["stopped"], lease["chunks"], lease["continue"]) == ("", 0, True)
    assert Run.objects.get(pk=run.pk).state == Run.State.ACTIVE
