"""The run's circuit breaker (runs.engine.breaker): one cause on a few chunks in a row is one
problem — the run needs attention naming the cause, its chunks stay pending, and one "retry
the run" after the fix drains it exactly."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from core.models import OperatorAction
from runs.actions import ActionError, retry_run, trigger_run
from runs.engine import planner, worker
from runs.models import Chunk, DeadLetter, Run
from tests.runs.conftest import NOW, count

pytestmark = pytest.mark.django_db(transaction=True)

ELIGIBLE = "occurred_at < %s AND (status = 'disputed') IS FALSE"


def drain(run: Run) -> Run:
    for _ in range(20):
        worker.drain(run.pk, until_idle=True, budget_s=60)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    return run


def rename(old: str, new: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE public.rr_events RENAME COLUMN {old} TO {new}")


def test_a_column_renamed_under_a_live_run_is_one_attention_item_and_one_retry_drains_it(
    events_policy, make_user, no_guard
):
    oncall = make_user("olga", "oncall")
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=1000)
    run.refresh_from_db()
    assert run.planner_done
    eligible = count("public.rr_events", ELIGIBLE, [run.cutoff])
    chunks = Chunk.objects.filter(run=run).count()
    assert eligible > 0 and chunks > 6

    rename("status", "status_renamed")
    run = drain(run)

    assert run.state == Run.State.ATTENTION
    assert run.state_reason.startswith("circuit breaker open")
    assert "(42703 column status)" in run.state_reason
    letters = DeadLetter.objects.filter(run=run)
    assert letters.count() == settings.RETENTION["BREAKER_CHUNKS"] - 1
    assert Chunk.objects.filter(run=run, state=Chunk.State.PENDING).count() == chunks - 2
    attention = OperatorAction.objects.filter(action="run.attention", target_id=str(run.pk))
    assert attention.count() == 1
    assert count("public.rr_events", "occurred_at < %s", [run.cutoff]) >= eligible  # none gone

    rename("status_renamed", "status")
    run = retry_run(run, actor=oncall, reason="INC-42 column renamed back")
    assert run.state == Run.State.ACTIVE
    now = timezone.now()
    pending = Chunk.objects.filter(run=run, state=Chunk.State.PENDING)
    assert pending.count() == chunks and not pending.filter(not_before__gt=now).exists()
    logged = OperatorAction.objects.get(action="run.retry", target_id=str(run.pk))
    assert sorted(logged.details["dead_letters"]) == sorted(letters.values_list("pk", flat=True))
    assert not letters.filter(resolution=DeadLetter.Resolution.OPEN).exists()

    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_events", ELIGIBLE, [run.cutoff]) == 0
    deleted = sum(r.rows_deleted for r in run.audit_records.all())
    assert deleted == eligible


def test_a_row_level_failure_never_opens_the_breaker_and_retry_refuses_a_healthy_run(
    events_policy, make_user, no_guard
):
    oncall = make_user("olga", "oncall")
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=1000)
    with pytest.raises(ActionError, match="can be retried"):
        retry_run(run, actor=oncall, reason="nothing wrong")
    assert not OperatorAction.objects.filter(action="run.retry").exists()
