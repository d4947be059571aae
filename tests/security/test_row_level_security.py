"""A target with row-level security, drained by the shipped worker login (``retention grants
apply --worker … --target …``): without BYPASSRLS the login would see no row (or some), delete
those and verify that none is left. The run is refused before it deletes, with one line naming
the table; once the grants give the login BYPASSRLS, it deletes every eligible row and the
checker agrees."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection
from psycopg import sql

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, DeadLetter, Run
from tests import zygote
from tests.factories import approved_policy
from tests.runs.conftest import NOW, ROOT, count, create_events, worker_env
from tests.security.roles import apply_grants, url_as
from tests.security.test_logins import grants_check

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def drain_as(role: str, password: str, run: Run) -> subprocess.CompletedProcess:
    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password)}
    return zygote.run(
        [sys.executable, "manage.py", "retention", "drain", run.run_key, "--until-idle",
         "--budget", "60"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip


@pytest.fixture
def secured(make_user):
    """``public.rr_events`` with row-level security: its one policy shows only tenant 1's rows
    to anyone but its owner (as an application's per-tenant policy would), and FORCE."""
    create_events(1200)
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_events ENABLE ROW LEVEL SECURITY")
        cur.execute("ALTER TABLE public.rr_events FORCE ROW LEVEL SECURITY")
        cur.execute("CREATE POLICY rr_tenant_one ON public.rr_events USING (tenant_id = 1)")
    policy = approved_policy(
        make_user, slug="events", table="public.rr_events", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", chunk_size=200,
        keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )  # fmt: skip
    yield policy
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


ELIGIBLE = "occurred_at < %s AND status <> 'disputed'"  # a NULL status is kept (unknown)


def test_a_table_with_row_level_security_is_refused_to_a_login_that_cannot_see_every_row(
    secured, worker_role, no_guard
):
    role, password = worker_role
    cutoff = NOW.replace(day=10)
    eligible = count("public.rr_events", ELIGIBLE, [cutoff])
    assert eligible > 500
    # the login as a deployment had it before: DELETE on the table, no BYPASSRLS
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_events DISABLE ROW LEVEL SECURITY")
        apply_grants("worker", role, "public.rr_events")
        cur.execute("ALTER TABLE public.rr_events ENABLE ROW LEVEL SECURITY")
    ok, text = grants_check("worker", role)
    assert (
        not ok and "lacks: role attribute BYPASSRLS (row-level security on public.rr_events" in text
    )

    run, _ = trigger_run(secured, tick=NOW)
    result = drain_as(role, password, run)
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, (run.state, run.state_reason, result.stderr[-2000:])
    assert run.state_reason.startswith(
        f"refused: public.rr_events has row-level security (FORCE) and login {role} does not "
        "bypass it"
    )
    assert "\n" not in run.state_reason
    assert count("public.rr_events", ELIGIBLE, [cutoff]) == eligible  # nothing deleted
    assert not AuditRecord.objects.filter(run=run).exists()
    assert DeadLetter.objects.filter(run=run).count() == 1

    # the grants give the worker login BYPASSRLS: a new run deletes every eligible row
    apply_grants("worker", role, "public.rr_events")
    assert "BYPASSRLS" not in grants_check("worker", role)[1]  # neither lacking nor beyond
    run.state = Run.State.CANCELLED
    run.save(update_fields=["state"])
    again, _ = trigger_run(secured, tick=NOW.replace(hour=4))
    result = drain_as(role, password, again)
    assert result.returncode == 0, result.stderr[-3000:]
    again.refresh_from_db()
    assert again.state == Run.State.DRAINED, again.state_reason
    assert again.state_reason.startswith("verified: no eligible row left")
    assert count("public.rr_events", ELIGIBLE, [again.bound]) == 0
    assert count("public.rr_events", ELIGIBLE, [cutoff]) < eligible / 10
    assert check_run(again, shadow=("public", "rr_events_shadow")) == []


def test_verification_by_a_login_that_cannot_see_every_row_never_says_none_is_left(
    secured, worker_role, no_guard
):
    """The run's verification by a login that sees only tenant 1's rows, none of which is left,
    while other tenants' eligible rows remain: it does not call the table drained."""
    from runs.engine import reconciler

    role, password = worker_role
    apply_grants("worker", role, "public.rr_events")
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("ALTER ROLE {} NOBYPASSRLS")
            .format(sql.Identifier(role))
            .as_string(cur.connection)
        )
    run, _ = trigger_run(secured, tick=NOW)
    Run.objects.filter(pk=run.pk).update(planner_done=True)  # as if its chunks were done
    # what the login can see is gone (as if its chunks deleted it); the other tenants' rows stay
    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.rr_events WHERE tenant_id = 1 AND " + ELIGIBLE, [run.bound])
    assert count("public.rr_events", ELIGIBLE, [run.bound]) > 300
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)).as_string(cur.connection))
        try:
            reconciler.finish_run(run)
        finally:
            cur.execute("RESET ROLE")
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state_reason
    assert "cannot verify: public.rr_events has row-level security (FORCE)" in run.state_reason
    assert "no eligible row left" not in run.state_reason
