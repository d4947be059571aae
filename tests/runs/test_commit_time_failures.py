"""A foreign key that restricts the DELETE, checked at once (``NO ACTION``) or at COMMIT
(``DEFERRABLE INITIALLY DEFERRED``, as Django creates every foreign key): either way the chunk's
failure is a statement failure with its SQLSTATE — permanent 23503, bisected down to the pinned
rows, dead-lettered with the SQLSTATE and the message — and every other row drains. Real worker
processes (``retention drain``)."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, DeadLetter, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events, manage

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SHADOW = ("public", "rr_events_shadow")
PINNED = 5
ELIGIBLE = "occurred_at < %s AND status <> 'disputed'"  # a NULL status is kept


@pytest.fixture
def events(transactional_db):
    create_events(3000)
    yield
    with connection.cursor() as cur:
        cur.execute(
            "DROP TABLE IF EXISTS public.rr_refs, public.rr_events, public.rr_events_shadow"
        )


@pytest.mark.parametrize("timing", [""], ids=["immediate"])
def test_a_restricting_foreign_key_dead_letters_its_rows_with_their_sqlstate_and_the_rest_drains(
    events, make_user, timing
):
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_refs (id serial PRIMARY KEY, event_id bigint NOT NULL"
            f" REFERENCES public.rr_events (id) ON DELETE NO ACTION {timing})"
        )
        # five eligible rows of different tenants and key ranges are referenced
        cur.execute(
            "INSERT INTO public.rr_refs (event_id) SELECT id FROM public.rr_events"
            " WHERE status = 'closed' AND occurred_at < %s ORDER BY id LIMIT %s",
            [NOW.replace(day=1), PINNED * 97],
        )
        cur.execute("DELETE FROM public.rr_refs WHERE id % 97 <> 1")
    policy = approved_policy(make_user, **events_spec(chunk_size=200))
    run, _ = trigger_run(policy, tick=NOW)

    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "90", timeout=300
    )

    assert result.returncode == 0, result.stderr
    assert "lost the database connection" not in result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state_reason
    letters = list(DeadLetter.objects.filter(run=run))
    assert letters and all(
        (letter.error_class, letter.sqlstate) == ("permanent", "23503") for letter in letters
    ), [(x.error_class, x.sqlstate, x.message) for x in letters]
    assert all("violates foreign key constraint" in letter.message for letter in letters)
    assert not any("killed" in letter.message for letter in letters)
    # bisected down to the pinned rows: exactly they are left of the eligible rows
    assert count("public.rr_events", ELIGIBLE, [run.cutoff]) == PINNED
    assert count("public.rr_refs") == PINNED
    dead = Chunk.objects.filter(run=run, state=Chunk.State.DEAD)
    assert all(chunk.last_sqlstate == "23503" for chunk in dead)
    assert (
        AuditRecord.objects.filter(run=run).count()
        == Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    )
    assert check_run(run, shadow=SHADOW, expect_drained=False) == []


def test_rows_a_deferred_foreign_key_references_are_kept_without_a_failed_chunk(events, make_user):
    """A ``DEFERRABLE INITIALLY DEFERRED`` key (as Django creates every one) from another table
    references five eligible rows: the chunks' DELETEs leave exactly those in place — no chunk
    fails, none is split, nothing is dead-lettered — and the run is drained, its verification
    counting them as kept: referenced by a row that stays."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_refs (id serial PRIMARY KEY, event_id bigint NOT NULL"
            " REFERENCES public.rr_events (id) ON DELETE NO ACTION DEFERRABLE INITIALLY DEFERRED)"
        )
        cur.execute("CREATE INDEX ON public.rr_refs (event_id)")
        cur.execute(
            "INSERT INTO public.rr_refs (event_id) SELECT id FROM public.rr_events"
            " WHERE status = 'closed' AND occurred_at < %s ORDER BY id LIMIT %s",
            [NOW.replace(day=1), PINNED * 97],
        )
        cur.execute("DELETE FROM public.rr_refs WHERE id % 97 <> 1")
    policy = approved_policy(make_user, **events_spec(chunk_size=200))
    run, _ = trigger_run(policy, tick=NOW)

    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "90", timeout=300
    )

    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert f"{PINNED} row(s) kept: referenced by a row that stays" in run.state_reason
    # one cause for the key, naming a referencing row, not one report per row
    (cause,) = run.verification["kept_referenced_by"]
    assert (cause["table"], cause["columns"]) == ("public.rr_refs", ["event_id"])
    assert (cause["rows"], cause["referencing"]) == (PINNED, PINNED)
    ref, event = re.fullmatch(r"id = (\d+) references id = (\d+)", cause["example"]).groups()
    assert count("public.rr_refs", "id = %s AND event_id = %s", [ref, event]) == 1
    assert f"e.g. {cause['example']}" in run.state_reason
    assert not DeadLetter.objects.filter(run=run).exists()
    assert not Chunk.objects.filter(run=run).exclude(state=Chunk.State.DONE).exists()
    assert count("public.rr_events", ELIGIBLE, [run.cutoff]) == PINNED
    assert count("public.rr_refs") == PINNED


def test_a_failure_while_committing_the_chunk_is_recorded_with_its_sqlstate_not_as_a_lost_connection(
    events, make_user
):
    """What still fails after the DELETE (the audit row, the chunk's state, COMMIT): a deferred
    constraint trigger on the audit table that refuses the record (as a missing grant would)
    stands for any of them. The transaction is gone, so the failure is recorded in one of its own: the chunk keeps
    its rows, gets the SQLSTATE and is dead-lettered (permanent) — the drain loop does not take
    it for a lost connection, nor the next attempt for a killed one."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION public.rr_refuse_audit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN RAISE EXCEPTION 'audit refused' USING ERRCODE = 'insufficient_privilege'; END$$"
        )
        cur.execute(
            "CREATE CONSTRAINT TRIGGER rr_refuse_audit AFTER INSERT ON runs_auditrecord"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.rr_refuse_audit()"
        )
    try:
        policy = approved_policy(make_user, **events_spec(chunk_size=200))
        run, _ = trigger_run(policy, tick=NOW)
        before = count("public.rr_events")

        stats = worker.drain(run.pk, budget_s=30, until_idle=True)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER rr_refuse_audit ON runs_auditrecord")
            cur.execute("DROP FUNCTION public.rr_refuse_audit()")

    assert count("public.rr_events") == before
    assert not AuditRecord.objects.filter(run=run).exists()
    letters = list(DeadLetter.objects.filter(run=run))
    assert letters and all(
        (x.error_class, x.sqlstate) == ("permanent", "42501") for x in letters
    ), [(x.error_class, x.sqlstate, x.message) for x in letters]
    assert all("audit refused" in x.message for x in letters)
    assert not any("killed" in x.message for x in letters)
    # one cause is one problem: the chunks that failed alike before the run's circuit breaker
    # opened are dead letters, the one that opened it stays pending with the run in attention
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state
    assert run.state_reason.startswith("circuit breaker open"), run.state_reason
    assert "42501" in run.state_reason and "audit refused" in run.state_reason
    assert stats["failed"] == len(letters) + 1, stats
    assert Chunk.objects.filter(run=run, state=Chunk.State.PENDING).exists()


def test_a_chunk_cancelled_while_its_commit_fails_is_left_cancelled(events, make_user, no_guard):
    """A cancel that closes the run's chunks while a chunk's COMMIT is failing (the cancel keeps
    the chunk's claim time): the attempt's failure, recorded afterwards in a transaction of its
    own, finds the chunk no longer pending and leaves it as the cancel left it — no dead
    letter, no split, no attempt counted. The COMMIT waits on an advisory lock the test holds
    (a deferred trigger on the audit row), the cancel queues behind the chunk's row lock, and
    the failure's record queues behind the cancel's."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.runs.processes import pg_connect, wait_for
    from tests.runs.test_decision_fence import in_thread

    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION public.rr_refuse_audit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN PERFORM pg_advisory_lock(424242); PERFORM pg_advisory_unlock(424242);"
            " RAISE EXCEPTION 'audit refused' USING ERRCODE = 'insufficient_privilege'; END$$"
        )
        cur.execute(
            "CREATE CONSTRAINT TRIGGER rr_refuse_audit AFTER INSERT ON runs_auditrecord"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.rr_refuse_audit()"
        )
    barrier, operator, observer = pg_connect(), pg_connect(autocommit=False), pg_connect()

    def waiting(*events: str) -> int:
        return observer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND wait_event = ANY(%s)",
            [list(events)],
        ).fetchone()[0]

    try:
        policy = approved_policy(make_user, **events_spec(chunk_size=200))
        run, _ = trigger_run(policy, tick=NOW)
        barrier.execute("SELECT pg_advisory_lock(424242)")
        with ThreadPoolExecutor(max_workers=2) as pool:
            drain = pool.submit(in_thread(lambda: worker.drain(run.pk, budget_s=60)))
            wait_for(lambda: waiting("advisory"), what="the chunk's COMMIT to wait")
            (in_flight,) = observer.execute(
                "SELECT id FROM runs_chunk WHERE run_id = %s AND claimed_at IS NOT NULL", [run.pk]
            ).fetchone()
            cancel = pool.submit(
                lambda: operator.execute(
                    "UPDATE runs_chunk SET state = 'cancelled' WHERE run_id = %s"
                    " AND state = 'pending'",
                    [run.pk],
                )
            )
            wait_for(lambda: waiting("transactionid"), what="the cancel to wait for the chunk")
            barrier.execute("SELECT pg_advisory_unlock(424242)")  # the COMMIT fails now
            cancel.result(timeout=60)
            wait_for(lambda: waiting("transactionid", "tuple"), what="the failure's record to wait")
            operator.execute("UPDATE runs_run SET state = 'cancelled' WHERE id = %s", [run.pk])
            operator.commit()
            drain.result(timeout=120)
    finally:
        for conn in (barrier, operator, observer):
            conn.close()
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER rr_refuse_audit ON runs_auditrecord")
            cur.execute("DROP FUNCTION public.rr_refuse_audit()")

    chunk = Chunk.objects.get(pk=in_flight)
    assert chunk.state == Chunk.State.CANCELLED
    assert chunk.attempts == 0 and chunk.last_sqlstate == ""
    assert not DeadLetter.objects.filter(run=run).exists()
    assert not Chunk.objects.filter(parent=chunk).exists()
    assert not AuditRecord.objects.filter(run=run).exists()


def test_each_failed_chunk_logs_one_line_and_no_pipeline_echo(events, make_user, caplog, no_guard):
    """A restricting key fails chunks (bisected down to the pinned rows): each failed attempt
    is one warning line naming the run, the chunk, the class and SQLSTATE — and psycopg's
    "error ignored … pipeline aborted" echo of each is not logged."""
    import logging

    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_refs (id serial PRIMARY KEY, event_id bigint NOT NULL"
            " REFERENCES public.rr_events (id) ON DELETE RESTRICT)"
        )
        cur.execute(
            "INSERT INTO public.rr_refs (event_id) SELECT id FROM public.rr_events"
            " WHERE status = 'closed' AND occurred_at < %s ORDER BY id LIMIT 2",
            [NOW.replace(day=1)],
        )
    policy = approved_policy(make_user, **events_spec(chunk_size=200))
    run, _ = trigger_run(policy, tick=NOW)
    with caplog.at_level(logging.DEBUG):
        stats = worker.drain(run.pk, budget_s=60, until_idle=True)
    failed = [r for r in caplog.records if " failed (attempt " in r.getMessage()]
    assert stats["failed"] >= 2 and len(failed) == stats["failed"], stats
    assert all(f"run {run.run_key}: chunk " in r.getMessage() for r in failed)
    assert all("SQLSTATE 23001" in r.getMessage() for r in failed)  # RESTRICT
    assert not [r for r in caplog.records if "pipeline aborted" in r.getMessage()]
