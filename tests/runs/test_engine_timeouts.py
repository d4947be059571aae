"""The engine's own statements inside a lease are bounded well inside django-q2's task
timeout: a verification on a locked target is postponed instead of outliving the task."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import planner, reconciler
from runs.models import Chunk, Run
from tests.runs.conftest import NOW
from tests.runs.processes import pg_connect

pytestmark = pytest.mark.django_db(transaction=True)  # the blocker must see the table


def test_a_verification_on_a_locked_target_is_bounded_and_postponed(events_policy, settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 12}  # one second per statement
    run, _ = trigger_run(events_policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    Chunk.objects.filter(run=run).update(state=Chunk.State.DONE)  # as if every chunk committed
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_events IN ACCESS EXCLUSIVE MODE")
    try:
        state = reconciler.finish_run(Run.objects.get(pk=run.pk))  # as a lease calls it
    finally:
        blocker.rollback()
        blocker.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
    run.refresh_from_db()
    assert state == Run.State.ACTIVE
    assert run.state_reason.startswith("verification postponed"), run.state_reason


@pytest.mark.processes
def test_a_drain_goes_on_while_another_session_holds_its_runs_row(events_policy):
    """The adaptive chunk size is written to the run's row after a chunk; a session holding that
    row (a finisher verifying the run holds it FOR NO KEY UPDATE) never stops the drain."""
    from runs.models import AuditRecord
    from tests.runs.conftest import manage

    run, _ = trigger_run(events_policy, tick=NOW)
    blocker = pg_connect(autocommit=False)
    blocker.execute("SELECT 1 FROM runs_run WHERE id = %s FOR NO KEY UPDATE", [run.pk])
    try:
        result = manage(
            "retention", "drain", run.run_key, "--budget", "15",
            env={"RETENTION_GUARD": "0"}, timeout=120,
        )  # fmt: skip
    finally:
        blocker.rollback()
        blocker.close()
    assert result.returncode == 0, result.stderr[-2000:]
    assert AuditRecord.objects.filter(run=run).count() >= 2, result.stdout
