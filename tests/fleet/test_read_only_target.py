"""A target that turns read-only under a run (a replica after fail-over): its run needs
attention naming the target and why, the other targets drain, and when it is writable again
the same run resumes and finishes exactly."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.core.management.base import CommandError
from django.db import connection

from runs.models import AuditRecord, Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db(transaction=True)


def _read_only(target, on: bool) -> None:
    """What a fail-over to a replica looks like to a login: every new session of the database
    read-only, and the sessions open before it gone."""
    with psycopg.connect(target.server.admin_url("postgres"), autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = {}").format(
                psycopg.sql.Identifier(target.database), psycopg.sql.SQL("on" if on else "off")
            )
        )
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [target.database],
        )
    C.close_all()


def test_a_target_that_turns_read_only_needs_attention_and_resumes_exactly(
    fleet, make_user, act_as, no_guard
):
    a, b = fleet[0], fleet[1]
    Target.objects.filter(name__in=[a.name, b.name]).update(group="pair")
    for target in (a, b):
        with C.on(target.name):
            create_events(1500, days=40)
    approved_policy(
        make_user, **events_spec(targets=["group:pair"], chunking="key", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    _read_only(a, True)
    try:
        run_cli("drain", "--until-idle", "--workers", "1")  # returns: no retrying forever
        status_a = json.loads(run_cli("status", keys[0], "--json"))
        status_b = json.loads(run_cli("status", keys[1], "--json"))
        assert status_b["state"] == "drained", status_b
        assert status_a["state"] == "attention", status_a
        assert status_a["state_reason"].startswith(
            f"target {a.name} is unreachable: read-only (a replica after a fail-over?): cannot"
            " execute"
        ), status_a
        assert Target.objects.get(name=a.name).unreachable_since is not None
    finally:
        _read_only(a, False)
    run_cli("drain", "--until-idle", "--workers", "1")
    status_a = json.loads(run_cli("status", keys[0], "--json"))
    assert status_a["state"] == "drained", status_a
    with C.on(a.name):
        run = Run.objects.get(run_key=keys[0])
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM public.rr_events WHERE occurred_at < %s"
                " AND status <> 'disputed'",
                [run.cutoff],
            )
            assert cur.fetchone()[0] == 0
        assert AuditRecord.objects.filter(run=run).exists()
    assert Target.objects.get(name=a.name).unreachable_since is None


def test_a_trigger_while_a_target_is_read_only_creates_the_others_runs_and_names_it(
    fleet, make_user, act_as, no_guard
):
    a, b = fleet[0], fleet[1]
    Target.objects.filter(name__in=[a.name, b.name]).update(group="pair")
    for target in (a, b):
        with C.on(target.name):
            create_events(200, days=40)
    approved_policy(make_user, **events_spec(targets=["group:pair"]))
    act_as(make_user("olga", "oncall"))
    _read_only(a, True)
    try:
        with pytest.raises(CommandError, match="some targets got no run"):
            run_cli("trigger", "events", "--period", NOW.date().isoformat())
        with C.on(b.name):
            assert Run.objects.count() == 1
    finally:
        _read_only(a, False)
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert [k.split(":")[0] for k in keys] == [a.name, b.name]
    with C.on(a.name):
        assert Run.objects.count() == 1
