"""``retention drain --until-idle``: a drain process with nothing admissible waits for the
run, and stops waiting as soon as the run is no longer active (another worker drained it)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.cli import wait_while_active
from runs.models import Run
from tests.runs.conftest import NOW
from tests.runs.processes import pg_connect


@pytest.mark.django_db(transaction=True)
def test_an_idle_drain_stops_waiting_when_another_worker_ends_the_run(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    looked = threading.Event()
    result: dict = {}

    def idle_worker() -> None:
        try:
            looked.set()
            result["timed_out"] = wait_while_active([run.pk], 120)
        finally:
            connection.close()

    waiter = threading.Thread(target=idle_worker)
    waiter.start()
    looked.wait(10)
    time.sleep(0.3)  # let it look at the run at least once (ordering only, not timed)
    with pg_connect() as other:  # the worker that verified the run commits its end
        other.execute("UPDATE runs_run SET state = 'drained' WHERE id = %s", [run.pk])
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the idle drain kept waiting after the run ended"
    assert result == {"timed_out": False}


@pytest.mark.django_db
def test_an_idle_drain_waits_its_time_while_the_run_is_active(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    assert wait_while_active([run.pk], 0.2) is True
    Run.objects.filter(pk=run.pk).update(state=Run.State.DRAINED)
    assert wait_while_active([run.pk], 60) is False


@pytest.mark.django_db(transaction=True)
def test_drain_until_idle_goes_on_with_a_run_admitted_after_its_round(events_policy, monkeypatch):
    """Another process drains the run this one found nothing admissible in; when that run ends,
    the policy's waiting run is admitted: ``--until-idle`` means until no run is active."""
    from datetime import timedelta

    from django.core.management import call_command

    from runs import cli
    from runs.engine.worker import drain as real_drain

    first, _ = trigger_run(events_policy, tick=NOW - timedelta(days=1))
    second, _ = trigger_run(events_policy, tick=NOW)
    assert (first.state, second.state) == (Run.State.ACTIVE, Run.State.WAITING)
    calls: list[int] = []

    def drain_elsewhere(run_id, **options):
        calls.append(run_id)
        if run_id == first.pk and calls.count(first.pk) == 1:
            # another worker drains it while this one finds no chunk admissible
            real_drain(first.pk, budget_s=60, until_idle=True)
            return {"chunks": 0, "rows": 0, "failed": 0, "throttled": 0,
                    "stopped": "idle: chunks in another worker's hands", "continue": True}  # fmt: skip
        return real_drain(run_id, **options)

    monkeypatch.setattr(cli, "drain_run", drain_elsewhere)
    call_command("retention", "drain", "--until-idle", "--budget", "60")
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == Run.State.DRAINED, first.state_reason
    assert second.state == Run.State.DRAINED, (second.state, second.state_reason, calls)


@pytest.mark.django_db(transaction=True)
def test_an_idle_drain_waits_for_the_session_verifying_the_run_instead_of_polling(
    events_policy, monkeypatch
):
    """Another session concludes the run (it holds the run's finisher lock while it verifies,
    as ``finish_run`` does): the idle drain looks once, waits for that transaction, and returns
    when it commits the run's end — no poll every ``IDLE_POLL_S`` meanwhile."""
    from core import locks
    from runs import cli

    run, _ = trigger_run(events_policy, tick=NOW)
    naps: list = []
    monkeypatch.setattr(cli.time, "sleep", lambda s: naps.append(s) or time.sleep(s))
    finisher = pg_connect(autocommit=False)
    finisher.execute("SELECT pg_advisory_xact_lock(%s, %s)", [locks.FINISHER, run.pk])
    finisher.execute("UPDATE runs_run SET state = 'drained' WHERE id = %s", [run.pk])
    done = threading.Timer(0.5, finisher.commit)  # the verification ends half a second later
    done.start()
    try:
        assert wait_while_active([run.pk], 30) is False
    finally:
        done.join()
        finisher.close()
    assert naps == []  # it waited on the finisher's transaction, not by polling


@pytest.mark.django_db(transaction=True)
def test_the_finisher_holds_the_runs_finisher_lock_while_it_verifies(events_policy, monkeypatch):
    from core import locks
    from runs.engine import planner, reconciler

    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=10_000)
    from runs.engine import worker

    while worker.process_one(run).kind != worker.NO_WORK:
        pass
    run.refresh_from_db()
    seen: list = []
    real_verify = reconciler.verify

    def verify(run, **kw):
        with pg_connect() as other:  # another session tries the lock an idle drain waits on
            seen.append(
                other.execute(
                    "SELECT pg_try_advisory_lock_shared(%s, %s)", [locks.FINISHER, run.pk]
                ).fetchone()[0]
            )
        return real_verify(run, **kw)

    monkeypatch.setattr(reconciler, "verify", verify)
    assert reconciler.finish_run(run) == Run.State.DRAINED
    assert seen == [False]  # held by the finisher
    connection.close()
