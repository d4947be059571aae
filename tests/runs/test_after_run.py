"""After a run: a run is concluded once, by the one session that holds it — another finisher
moves on instead of waiting."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django_q.models import OrmQ

from core.models import OperatorAction
from runs import planner, worker
from runs.actions import trigger_run
from runs.models import AuditRecord, Run
from runs.reconciler import finish_run, reconcile
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
            lambda: observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE %s",
                [f"%{TABLE.replace('.', '%')}%"],
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
