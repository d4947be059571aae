"""The workers can run as a least-privilege role (`retention grants apply --worker`): it drains a run,
and it cannot run DDL, rewrite the audit trail or touch target rows beyond DELETE."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.engine.reconciler import finish_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, GuardSample, Run
from tests import zygote
from tests.factories import approved_policy
from tests.runs.conftest import NOW, ROOT, create_events, worker_env
from tests.security.roles import apply_grants, connect_as, url_as

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def run(make_user):
    create_events(2400)
    policy = approved_policy(
        make_user, slug="events", table="public.rr_events", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", chunk_size=200,
        keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    yield run
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def test_a_least_privilege_role_drains_a_run_and_can_do_nothing_else(run, worker_role):
    role, password = worker_role
    apply_grants("worker", role, "public.rr_events")

    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password)}
    result = zygote.run(
        [sys.executable, "manage.py", "retention", "drain", run.run_key, "--until-idle",
         "--budget", "60"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert AuditRecord.objects.filter(run=run).exists()
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []

    refused = {
        "CREATE TABLE public.rr_new (id int)",
        "CREATE SCHEMA rr_new",
        "DROP TABLE public.rr_events",
        "ALTER TABLE public.rr_events ADD COLUMN x int",
        "CREATE INDEX ON public.rr_events (status)",
        "TRUNCATE public.rr_events",
        "UPDATE public.rr_events SET status = 'x'",
        "INSERT INTO public.rr_events (id, tenant_id, occurred_at) VALUES (-1, 1, now())",
        "UPDATE runs_auditrecord SET rows_deleted = 0",
        "DELETE FROM runs_auditrecord",
        "TRUNCATE runs_auditrecord",
        "UPDATE retention_operatoraction SET reason = ''",
        "DELETE FROM retention_operatoraction",
        "UPDATE retention_policyversion SET state = 'approved'",
        "INSERT INTO retention_legalhold (reason) VALUES ('x')",
        "DELETE FROM retention_legalhold",
        'UPDATE retention_killswitch SET "on" = false',
        "SELECT * FROM auth_user",
        "SET ROLE postgres",
    }
    # the cleanup cluster's other tasks: a reconciler pass (it prunes old guard samples)
    # and a trigger (scheduled triggers and catch-up runs create runs)
    old = GuardSample.objects.create(values={}, tables={})
    GuardSample.objects.filter(pk=old.pk).update(taken_at=NOW - timedelta(days=30))
    scheduled = (
        "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
        "import django; django.setup(); from runs.tasks import trigger_scheduled; "
        "from retention.models import Policy; "
        "from django.utils import timezone; "
        "tick = timezone.now().replace(second=0, microsecond=0).isoformat(); "
        "print(trigger_scheduled(Policy.objects.get().pk, tick))"
    )  # a firing on time (a manual trigger acts as a person: tests/security/test_cli_identity.py)
    runs_before = Run.objects.count()
    for command in (["manage.py", "retention", "reconcile"], ["-c", scheduled]):
        result = zygote.run(
            [sys.executable, *command],
            cwd=ROOT, env=env, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    assert not GuardSample.objects.filter(pk=old.pk).exists()
    assert Run.objects.count() == runs_before + 1, result.stdout  # the worker role inserted it

    rows = AuditRecord.objects.count()
    with connect_as(role, password) as conn:
        for statement in sorted(refused):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert AuditRecord.objects.count() == rows


def _vacuum_as(role: str, password: str, run_id: int) -> str:
    """The cleanup cluster's ``vacuum_target`` task, in a process connected as ``role``."""
    code = (
        "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
        "import django; django.setup(); from runs.tasks import vacuum_target; "
        f"print(vacuum_target({run_id}))"
    )
    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password)}
    result = zygote.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _last_vacuum():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT last_vacuum FROM pg_stat_user_tables"
            " WHERE schemaname = 'public' AND relname = 'rr_events'"
        )
        return cur.fetchone()[0]


def test_a_vacuum_the_worker_role_may_not_run_fails_with_one_clear_error_on_the_run(
    make_user, worker_role
):
    """``vacuum = "run"``: PostgreSQL skips a table the role may not vacuum with only a
    warning; the task records that as the run's vacuum outcome, in one sentence. On
    PostgreSQL 17 and later a grant of MAINTAIN on the table is what the role needs."""
    role, password = worker_role
    create_events(1200)
    policy = approved_policy(
        make_user, slug="events", table="public.rr_events", key="id", timestamp="occurred_at",
        retention="20 days", schedule="0 3 * * *", chunk_size=200, vacuum="run",
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    try:
        apply_grants("worker", role, "public.rr_events")
        while not run.planner_done:
            planner.plan(run, window=1000)
        while worker.process_one(run).kind == worker.DONE:
            pass
        assert finish_run(run) == Run.State.DRAINED
        run.refresh_from_db()
        assert run.verification["vacuum_state"] == "scheduled"

        _vacuum_as(role, password, run.pk)
        run.refresh_from_db()
        assert run.verification["vacuum_state"] == "failed", run.verification
        note = run.verification["vacuum_note"]
        assert note.startswith("VACUUM (ANALYZE) public.rr_events failed: "), note
        assert '"rr_events"' in note and "may not vacuum it" in note, note  # PostgreSQL's words
        assert _last_vacuum() is None

        with connection.cursor() as cur:
            cur.execute("SHOW server_version_num")
            version = int(cur.fetchone()[0])
        if version >= 170000:
            with connection.cursor() as cur:
                cur.execute(
                    sql.SQL("GRANT MAINTAIN ON TABLE public.rr_events TO {}")
                    .format(sql.Identifier(role))
                    .as_string(cur.connection)
                )
            Run.objects.filter(pk=run.pk).update(
                verification={**run.verification, "vacuum_state": "scheduled"}
            )
            _vacuum_as(role, password, run.pk)
            run.refresh_from_db()
            assert run.verification["vacuum_state"] == "done", run.verification
            assert _last_vacuum() is not None
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
