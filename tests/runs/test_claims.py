"""A claim is committed before its chunk transaction, which then locks the chunk row. Another
worker's claim statement may hold that row for an instant (``FOR UPDATE SKIP LOCKED`` locks a
row it then finds claimed and passes over): the chunk transaction waits for it instead of giving
the chunk up while its claim stays, which would keep every worker off the chunk until the claim
expires and then count a killed attempt that never happened."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import guard, planner, worker
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import pg_connect, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claimed_chunk_whose_row_is_held_for_an_instant_is_deleted_not_left_claimed(make_user):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    run = Run.objects.select_related("policy_version", "policy").get(pk=run.pk)
    planner.plan(run)
    spec = run.policy_version.parsed
    claim = worker._claim(run, spec, chunk_id=None, skip_tenants=[])
    assert claim is not None and not claim.killed

    other = pg_connect(autocommit=False)  # as a claim statement passing over the row
    other.execute("SELECT 1 FROM runs_chunk WHERE id = %s FOR UPDATE", [claim.chunk_id])
    outcomes = []

    def attempt():
        try:
            outcomes.append(worker._attempt(run, spec, claim, guard.ADMIT))
        except Exception as exc:  # the test reports it below
            outcomes.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=attempt)
    thread.start()
    observer = pg_connect()
    holder = other.info.backend_pid
    try:
        wait_for(
            lambda: (
                observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    [holder],
                ).fetchone()[0]
                or not thread.is_alive()
            ),
            what="the chunk transaction waiting for the row",
        )
    finally:
        other.rollback()
        other.close()
        observer.close()
    thread.join(timeout=60)

    (outcome,) = outcomes
    assert isinstance(outcome, worker.Outcome), outcome
    assert outcome.kind == worker.DONE, outcome
    chunk = Chunk.objects.get(pk=claim.chunk_id)
    assert chunk.state == Chunk.State.DONE and chunk.claimed_at is None
    assert chunk.attempts == 1
    assert AuditRecord.objects.filter(chunk=chunk).count() == 1


def test_a_chunk_another_attempt_took_over_is_left_to_it(make_user):
    """A claim that expired and was taken over (by a later claim, or released by an outcome)
    is no longer this attempt's: its transaction leaves the chunk alone."""
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    run = Run.objects.select_related("policy_version", "policy").get(pk=run.pk)
    planner.plan(run)
    spec = run.policy_version.parsed
    stale = worker._claim(run, spec, chunk_id=None, skip_tenants=[])
    Chunk.objects.filter(pk=stale.chunk_id).update(claimed_at=None)  # released meanwhile

    outcome = worker._attempt(run, spec, stale, guard.ADMIT)

    assert outcome.kind == worker.NO_WORK, outcome
    chunk = Chunk.objects.get(pk=stale.chunk_id)
    assert chunk.state == Chunk.State.PENDING and chunk.attempts == 0
    assert not AuditRecord.objects.filter(chunk=chunk).exists()
