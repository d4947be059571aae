"""After a run: a drained run records the dead tuples its deletes left on the target and,
as the policy's ``vacuum`` says, recommends ``VACUUM (ANALYZE)`` or schedules it on the
cleanup cluster once the drain has committed; and a run is concluded once, by the one
session that holds it — another finisher moves on instead of waiting."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client, override_settings
from django.urls import reverse
from django_q.models import OrmQ

from core.models import OperatorAction
from runs import tasks
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.engine.reconciler import finish_run, reconcile
from runs.evidence.exports import manifest_header
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import pg_connect, wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit, VACUUM, a second session

TABLE = "public.rr_events"
VACUUM_TASK = "runs.tasks.vacuum_target"


def _sql(text: str, params=None):
    with connection.cursor() as cur:
        cur.execute(text, params or [])
        return cur.fetchone() if cur.description else None


def deleted_but_not_finished(make_user, **spec) -> Run:
    """A run whose every chunk committed, not yet verified (what a lease or the reconciler
    finds), on a table autovacuum leaves alone (its dead tuples stay countable)."""
    create_events(3000)
    _sql(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    policy = approved_policy(make_user, **events_spec(**spec))
    run, _ = trigger_run(policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    # the guard off while the chunks commit: a busy machine's probe must not leave one pending
    with override_settings(RETENTION={**settings.RETENTION, "GUARD": False}):
        while worker.process_one(run).kind == worker.DONE:
            pass
    # this session did the deletes: hand its table statistics to the shared ones now
    _sql("SELECT pg_stat_force_next_flush()")
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE and run.verification is None
    return run


def rows_deleted(run: Run) -> int:
    return sum(AuditRecord.objects.filter(run=run).values_list("rows_deleted", flat=True))


def vacuum_messages() -> list:
    return [q for q in OrmQ.objects.all() if q.func() == VACUUM_TASK]


def vacuums() -> tuple:
    """(manual VACUUMs counted on the table, when the last one ended)."""
    return _sql(
        "SELECT vacuum_count, last_vacuum FROM pg_stat_user_tables"
        " WHERE schemaname = 'public' AND relname = 'rr_events'"
    )


def verification_section(run: Run, make_user) -> str:
    client = Client()
    client.force_login(make_user("vera-after", "viewer"))
    html = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    return html.split('data-testid="verification"', 1)[1].split("</section>", 1)[0]


@pytest.fixture(autouse=True)
def _drop_events():
    yield
    _sql("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_a_drained_run_recommends_a_vacuum_with_its_dead_tuples(make_user):
    run = deleted_but_not_finished(make_user)  # vacuum = "recommend", the default
    deleted = rows_deleted(run)
    assert deleted > 1000

    assert finish_run(run) == Run.State.DRAINED
    run.refresh_from_db()
    v = run.verification
    assert v["remaining"] == 0
    assert v["dead_tuples"] == deleted
    assert isinstance(v["live_tuples"], int)  # an estimate (as ANALYZE and the counters say)
    note = f"recommended: VACUUM (ANALYZE) {TABLE} ({deleted:,} dead tuples)"
    assert v["vacuum_note"] == note
    assert vacuum_messages() == []  # recommended, not scheduled

    section = verification_section(run, make_user)
    assert note in section and "Dead tuples" in section
    assert manifest_header(run)["verification"]["vacuum_note"] == note
    out = StringIO()
    call_command("retention", "status", run.run_key, stdout=out)
    assert f"vacuum                     {note}" in out.getvalue()


def test_the_dead_tuples_are_counted_from_the_runs_ledger_not_from_unflushed_statistics(
    make_user,
):
    """The finisher is usually the worker that deleted the last chunks: PostgreSQL's statistics
    do not show its own deletes until its backend flushes them (about a second later)."""
    create_events(3000)
    _sql(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    while not run.planner_done:
        planner.plan(run, window=1000)
    # the guard off while the chunks commit: a busy machine's probe must not leave one pending
    with override_settings(RETENTION={**settings.RETENTION, "GUARD": False}):
        while worker.process_one(run).kind == worker.DONE:
            pass
    assert finish_run(Run.objects.get(pk=run.pk)) == Run.State.DRAINED  # at once, no flush
    run.refresh_from_db()
    deleted = rows_deleted(run)
    assert run.verification["dead_tuples"] == deleted > 1000
    assert run.verification["vacuum_note"] == (
        f"recommended: VACUUM (ANALYZE) {TABLE} ({deleted:,} dead tuples)"
    )


def test_vacuum_run_schedules_one_vacuum_after_the_drain_commits_and_it_vacuums(make_user):
    run = deleted_but_not_finished(make_user, vacuum="run")
    assert vacuums() == (0, None)

    with transaction.atomic():
        assert finish_run(run) == Run.State.DRAINED
        assert vacuum_messages() == []  # nothing is sent before the drain commits
    (message,) = vacuum_messages()
    assert list(message.task["args"]) == [run.pk] and message.key == "cleanup"
    run.refresh_from_db()
    assert run.verification["vacuum_note"] == f"VACUUM (ANALYZE) {TABLE} scheduled"
    assert run.verification["dead_tuples"] == rows_deleted(run)
    assert "VACUUM (ANALYZE) public.rr_events scheduled" in verification_section(run, make_user)

    # the drained run is never concluded again, so nothing is scheduled twice
    assert finish_run(run) == Run.State.DRAINED
    reconcile()
    assert len(vacuum_messages()) == 1

    outcome = tasks.vacuum_target(run.pk)  # what the cleanup cluster runs
    count, last = vacuums()
    assert count == 1 and last is not None, outcome
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "done", run.verification
    assert run.verification["vacuum_note"].startswith(f"VACUUM (ANALYZE) {TABLE} done")
    assert run.verification["vacuum_finished_at"]
    # a second delivery of the same message is a no-op
    tasks.vacuum_target(run.pk)
    assert vacuums()[0] == 1


def test_a_scheduled_vacuum_that_cannot_lock_the_table_says_so_and_keeps_the_session(
    make_user, settings
):
    run = deleted_but_not_finished(make_user, vacuum="run")
    assert finish_run(run) == Run.State.DRAINED
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "scheduled"
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 12}  # the VACUUM waits 1 s for a lock
    blocker = pg_connect(autocommit=False)  # a long maintenance command of someone else's
    blocker.execute(f"LOCK TABLE {TABLE} IN SHARE UPDATE EXCLUSIVE MODE")
    try:
        note = tasks.vacuum_target(run.pk)
    finally:
        blocker.rollback()
        blocker.close()
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "failed"
    assert run.verification["vacuum_note"] == note
    assert note.startswith(f"VACUUM (ANALYZE) {TABLE} not run: another session held"), note
    assert vacuums()[0] == 0
    # the worker's session keeps its own timeouts for whatever it runs next
    assert _sql("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')") == (
        "0",
        "0",
    )


def test_vacuum_off_records_the_dead_tuples_and_neither_recommends_nor_schedules(make_user):
    run = deleted_but_not_finished(make_user, vacuum="off")
    assert finish_run(run) == Run.State.DRAINED
    run.refresh_from_db()
    assert run.verification["dead_tuples"] == rows_deleted(run)
    assert "vacuum_note" not in run.verification
    assert vacuum_messages() == []
    assert "VACUUM" not in verification_section(run, make_user)


def test_unreadable_statistics_never_keep_a_run_from_draining(make_user, monkeypatch):
    run = deleted_but_not_finished(make_user, vacuum="run")
    from runs.engine import maintenance

    # the statistics read fails in PostgreSQL (as a missing view, a timeout or a refusal would)
    monkeypatch.setattr(
        maintenance, "TUPLES_SQL", "SELECT * FROM pg_catalog.rr_no_such_view WHERE %s < %s"
    )

    with transaction.atomic():
        assert finish_run(run) == Run.State.DRAINED
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert run.verification["remaining"] == 0
    assert run.verification["dead_tuples"] == rows_deleted(run)  # from the run's own ledger
    note = run.verification["vacuum_note"]
    assert note.startswith(f"VACUUM (ANALYZE) {TABLE} scheduled"), note
    assert "statistics could not be read" in note and "rr_no_such_view" in note
    assert len(vacuum_messages()) == 1


def test_a_finisher_does_not_wait_for_the_run_another_is_finishing(make_user, settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 120}  # verification may wait 10 s
    run = deleted_but_not_finished(make_user)
    # the first finisher verifies while a foreground session holds the table: it waits in its
    # verification, holding the run
    table_lock = pg_connect(autocommit=False)
    table_lock.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    first: dict = {}

    def finish_first() -> None:
        try:
            first["state"] = finish_run(Run.objects.get(pk=run.pk))
        finally:
            connection.close()

    thread = threading.Thread(target=finish_first)
    thread.start()
    observer = pg_connect()
    try:
        wait_for(
            # a lock on the table not granted (not the statement's text: pg_stat_activity keeps
            # only its first track_activity_query_size bytes)
            lambda: observer.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [TABLE],
            ).fetchone()[0],
            timeout=30,
            what="the first finisher waiting in its verification",
        )
        # the second finisher (another lease): back at once with the run's state, not concluded
        with transaction.atomic():
            # a bound only so that waiting for the row fails instead of hanging
            _sql("SET LOCAL lock_timeout = '5s'")
            assert finish_run(Run.objects.get(pk=run.pk)) == Run.State.ACTIVE
        assert Run.objects.get(pk=run.pk).verification is None
        assert thread.is_alive()
    finally:
        table_lock.rollback()
        table_lock.close()
        thread.join(timeout=60)
        observer.close()

    assert first["state"] == Run.State.DRAINED  # the one holding the run concluded it
    assert finish_run(Run.objects.get(pk=run.pk)) == Run.State.DRAINED
    drained = OperatorAction.objects.filter(
        action="run.drained", target_type="run", target_id=str(run.pk)
    )
    assert drained.count() == 1


def test_a_finisher_skips_a_run_whose_row_another_session_holds(make_user):
    run = deleted_but_not_finished(make_user)
    holder = pg_connect(autocommit=False)
    holder.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])
    try:
        with transaction.atomic():
            _sql("SET LOCAL lock_timeout = '5s'")  # waiting fails instead of hanging
            assert finish_run(run) == Run.State.ACTIVE
    finally:
        holder.rollback()
        holder.close()
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE and run.verification is None
    # the next pass (the reconciler's, after a crash of the holder) concludes it
    reconcile()
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED


# -- a VACUUM that waits on a task has an owner and a deadline (the reconciler) ------------


def _past_deadline():
    """An instant past the deadline of every task sent or started before now."""
    from datetime import timedelta

    from django.utils import timezone

    from core import timeouts

    return timezone.now() + timedelta(seconds=timeouts.task_deadline_s() + 1)


def test_a_scheduled_vacuum_whose_message_was_lost_is_sent_again_by_the_reconciler(make_user):
    run = deleted_but_not_finished(make_user, vacuum="run")
    with transaction.atomic():
        assert finish_run(run) == Run.State.DRAINED
    OrmQ.objects.all().delete()  # the process died between the commit and the send
    reconcile()  # within the deadline: the message may still be on its way
    assert vacuum_messages() == []
    reconcile(now=_past_deadline())
    (message,) = vacuum_messages()
    assert list(message.task["args"]) == [run.pk]
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "scheduled"
    assert "sent again" in run.verification["vacuum_note"], run.verification
    tasks.vacuum_target(run.pk)
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "done", run.verification
    assert vacuums()[0] == 1


def test_a_vacuum_whose_sends_all_go_unanswered_says_why_it_did_not_run(make_user):
    run = deleted_but_not_finished(make_user, vacuum="run")
    finish_run(run)
    for _ in range(5):
        OrmQ.objects.all().delete()
        reconcile(now=_past_deadline())
        Run.objects.filter(pk=run.pk).update(
            verification={
                **Run.objects.get(pk=run.pk).verification,
                "vacuum_scheduled_at": "2000-01-01T00:00:00+00:00",
            }
        )
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "not run", run.verification
    assert "never started" in run.verification["vacuum_note"]
    assert OperatorAction.objects.filter(action="run.vacuum_not_run").count() == 1


@pytest.mark.processes
def test_a_vacuum_killed_with_its_worker_is_retried_by_the_reconciler(make_user):
    """SIGKILL of the cleanup cluster while its VACUUM waits for a lock: the run said
    "running (no outcome recorded yet)" for ever, and a redelivery "nothing to do"."""
    import signal

    from tests.runs.processes import kill_group, spawn

    run = deleted_but_not_finished(make_user, vacuum="run")
    blocker = pg_connect(autocommit=False)  # someone's maintenance holds the table
    blocker.execute(f"LOCK TABLE {TABLE} IN SHARE UPDATE EXCLUSIVE MODE")
    with transaction.atomic():
        assert finish_run(run) == Run.State.DRAINED
    cluster = spawn("qcluster", env={"Q_CLUSTER_NAME": "cleanup"})
    observer = pg_connect()
    try:
        wait_for(
            lambda: observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query ILIKE 'VACUUM%%' AND datname = current_database()"
            ).fetchone()[0],
            timeout=60,
            interval=0.05,
            what="the VACUUM waiting for its lock",
        )
        kill_group(cluster, signal.SIGKILL)
    finally:
        kill_group(cluster, signal.SIGKILL)
        blocker.rollback()
        blocker.close()
        observer.close()
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "running"  # nothing recorded its end
    assert tasks.vacuum_target(run.pk).endswith("nothing to do (running)")  # a redelivery
    reconcile()  # the task may still be running: left alone
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "running"
    reconcile(now=_past_deadline())
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "scheduled", run.verification
    assert "recorded no outcome" in run.verification["vacuum_note"]
    assert vacuum_messages()
    # (the killed worker's backend may have finished its VACUUM once the lock was free)
    before = vacuums()[0]
    tasks.vacuum_target(run.pk)
    run.refresh_from_db()
    assert run.verification["vacuum_state"] == "done", run.verification
    assert vacuums()[0] == before + 1
