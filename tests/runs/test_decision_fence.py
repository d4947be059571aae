"""Operator decisions are ordered against chunk transactions in flight (design invariant 6):
approving a new version, the kill switch, pausing a policy or a run and cancelling a run
each wait for the chunks already past their fence, so once the decision commits no chunk
that contradicts it commits. Real concurrency: the chunk's DELETE is blocked on a row lock
held by another session while the decision is taken in a third."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from core.models import OperatorAction
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events
from tests.runs.processes import backends_waiting_on_delete, pg_connect, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

IN_CHUNK = "id >= %s AND id < %s AND tenant_id::text = %s"


@pytest.fixture
def table(transactional_db, settings):
    # the row lock must reach the DELETE: with the guard on, no chunk would start
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    yield "rr_events"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def approve_new_version(policy, run, make_user):
    approved_policy(make_user, **events_spec(retention="25 days"))
    return "version.approve"


def pause_policy(policy, run, make_user):
    from retention.actions import pause_policy as pause

    pause(policy, actor=make_user("olga", "oncall"), reason="incident")
    return "policy.pause"


def pause_run(policy, run, make_user):
    from runs.actions import pause_run as pause

    pause(run, actor=make_user("olga", "oncall"), reason="incident")
    return "run.pause"


def cancel_run(policy, run, make_user):
    from runs.actions import cancel_run as cancel

    cancel(run, actor=make_user("olga", "oncall"), reason="wrong table")
    return "run.cancel"


def kill_switch(policy, run, make_user):
    from runs.actions import set_kill_switch

    set_kill_switch(True, actor=make_user("olga", "oncall"), reason="drill")
    return "kill_switch.on"


def advisory_waiters(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
    ).fetchone()[0]


def in_thread(fn):
    def call():
        try:
            return fn()
        finally:
            connection.close()

    return call


@pytest.mark.parametrize(
    "decide", [approve_new_version, pause_policy, pause_run, cancel_run, kill_switch]
)
def test_no_chunk_commits_against_a_decision_after_it_commits(table, make_user, decide):
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    chunk = Chunk.objects.filter(run=run).order_by("seq", "id").first()
    before = count("rr_events")
    blocker = pg_connect(autocommit=False)
    blocker.execute(
        f"SELECT 1 FROM public.rr_events WHERE {IN_CHUNK} FOR UPDATE",
        [chunk.key_from, chunk.key_to, chunk.tenant],
    )
    observer = pg_connect()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            in_flight = pool.submit(
                in_thread(lambda: worker.process_one(Run.objects.get(pk=run.pk), chunk_id=chunk.pk))
            )
            wait_for(lambda: backends_waiting_on_delete(observer, "rr_events"), what="the DELETE")
            decision = pool.submit(in_thread(lambda: decide(policy, run, make_user)))
            # the decision either waits for the chunk in flight or (before the fence) commits at once
            wait_for(
                lambda: decision.done() or advisory_waiters(observer),
                what="the decision to commit or to wait",
            )
            blocker.rollback()
            outcome = in_flight.result(timeout=60)
            action = decision.result(timeout=60)
    finally:
        blocker.close()
        observer.close()
    decided_at = OperatorAction.objects.filter(action=action).latest("at").at
    assert outcome.kind in (worker.DONE, worker.STOP)
    late = AuditRecord.objects.filter(run=run, committed_at__gte=decided_at)
    assert not late.exists(), "a chunk committed under the old decision after the new one"
    # and no later chunk of this run deletes anything
    later = worker.process_one(Run.objects.get(pk=run.pk))
    assert later.kind in (worker.STOP, worker.NO_WORK)  # a cancelled run has no chunk to claim
    gone = before - count("rr_events")
    assert gone == sum(AuditRecord.objects.filter(run=run).values_list("rows_deleted", flat=True))


def test_a_chunk_behind_a_pending_decision_gives_up_and_other_policies_go_on(table, make_user):
    from core import locks

    create_events(1000, name="rr_other")
    slow = approved_policy(
        make_user, **events_spec(timeouts={"lock_ms": 200, "statement_ms": 5000})
    )
    other = approved_policy(make_user, **events_spec(slug="other", table="rr_other"))
    runs = {}
    for policy in (slow, other):
        runs[policy.slug], _ = trigger_run(policy, tick=NOW)
        planner.plan(runs[policy.slug])
    decider = pg_connect()  # a decision on the first policy, holding its fence
    decider.execute("SELECT pg_advisory_lock(%s, %s)", [locks.POLICY_FENCE, slow.pk])
    try:
        queued = worker.process_one(Run.objects.get(pk=runs["events"].pk))
        assert (queued.kind, queued.reason) == (
            worker.BUSY,
            "waiting for an operator decision to commit",
        )
        assert worker.process_one(Run.objects.get(pk=runs["other"].pk)).kind == worker.DONE
    finally:
        decider.close()
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_other, public.rr_other_shadow")
    assert not AuditRecord.objects.filter(run=runs["events"]).exists()
    assert Chunk.objects.filter(run=runs["events"], attempts__gt=0).count() == 0
    assert worker.process_one(Run.objects.get(pk=runs["events"].pk)).kind == worker.DONE
