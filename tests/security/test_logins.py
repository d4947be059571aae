"""Each database login a deployment creates, attacked the way a reviewer with that login's
password would: connected to real PostgreSQL as web, worker, operator and monitor — their
grants given by the product's own command (`retention grants apply`) — and as the owner.

What a leaked login must not be: a way to read another session's SQL (and so a session key),
to plant a row a cluster unpickles, to undo an operator's decision, to make or become a
person, to rewrite the audit trail, or to own or drop anything. Each attempt below is refused
by the database or detected (and made ineffective) by the product."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import threading

import psycopg
import pytest
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from psycopg import sql

from core.models import ApiToken
from core.roles import roles_of
from core.tokens import TokenError, create_token, user_for_token
from retention.actions import pause_policy
from runs.actions import pause_run, trigger_run
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.security.roles import apply_grants, connect_as

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("web", "worker", "operator", "monitor")
TARGET = "public.rr_events"


@pytest.fixture
def logins():
    """One real login per kind, granted by `retention grants apply`; dropped afterwards."""
    create_events(300)
    made = {}
    with connection.cursor() as cur:
        for kind in KINDS:
            role = f"rr_{kind}_{os.getpid()}_{secrets.token_hex(3)}"
            password = secrets.token_urlsafe(16)
            cur.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}")
                .format(sql.Identifier(role), sql.Literal(password))
                .as_string(cur.connection)
            )
            made[kind] = (role, password)
    for kind, (role, _) in made.items():
        apply_grants(kind, role, TARGET)
    yield made
    with connection.cursor() as cur:
        for role, _ in made.values():
            cur.execute(
                sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)).as_string(cur.connection)
            )
            cur.execute(
                sql.SQL("DROP ROLE {}").format(sql.Identifier(role)).as_string(cur.connection)
            )
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def grants_check(kind: str, role: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command(
            "retention", "grants", "check", f"--{kind}", role, "--target", TARGET, stdout=out
        )
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def refused(conn, statement, params=()) -> bool:
    try:
        conn.execute(statement, params)
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.WrongObjectType):
        return True
    return False


def test_each_login_holds_exactly_what_it_needs_and_check_names_anything_more(logins):
    for kind, (role, _) in logins.items():
        ok, out = grants_check(kind, role)
        assert ok, out
        assert f"{role} ({kind}): exactly what it needs" in out
    worker = logins["worker"][0]
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("GRANT pg_monitor TO {}")
            .format(sql.Identifier(worker))
            .as_string(cur.connection)
        )
        cur.execute(
            sql.SQL("GRANT UPDATE ON retention_policyversion TO {}")
            .format(sql.Identifier(worker))
            .as_string(cur.connection)
        )
    ok, out = grants_check("worker", worker)
    assert not ok
    assert "beyond: member of role pg_monitor" in out
    assert "beyond: UPDATE on retention_runner.retention_policyversion" in out
    # applying again is idempotent and takes back what it granted too much (not memberships,
    # which only an administrator revokes)
    apply_grants("worker", worker, TARGET)
    ok, out = grants_check("worker", worker)
    assert "retention_policyversion" not in out and "pg_monitor" in out


def test_no_login_reads_another_sessions_sql_but_the_guard_still_counts_lock_waits(
    logins, make_user
):
    """A session key in another session's statement text stays unreadable; the guard reads
    lock waits through its SECURITY DEFINER function (aggregates only), on the table of an
    approved policy."""
    approved_policy(make_user, **events_spec())
    marker = f"session-key-{secrets.token_hex(8)}"
    holder = psycopg.connect(**_owner_params(), application_name="application")  # the app
    holder.execute("LOCK TABLE public.rr_events IN ACCESS EXCLUSIVE MODE")
    waiter_started = threading.Event()
    web = connect_as(*logins["web"])
    web.execute(f"SELECT '{marker}'")  # noqa: S608 — the statement text is the point

    def wait_for_the_lock():
        with psycopg.connect(
            **_owner_params(), autocommit=True, application_name="foreground"
        ) as c:
            waiter_started.set()
            c.execute("SELECT count(*) FROM public.rr_events")

    waiter = threading.Thread(target=wait_for_the_lock)
    waiter.start()
    try:
        waiter_started.wait(10)
        with psycopg.connect(**_owner_params(), autocommit=True) as owner:
            _wait(
                lambda: (
                    owner.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    ).fetchone()[0]
                    >= 1
                )
            )
            # the test can fail: a privileged reader sees the key
            assert (
                owner.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s", [f"%{marker}%"]
                ).fetchone()[0]
                >= 1
            )
        for kind in ("worker", "operator", "monitor"):
            with connect_as(*logins[kind]) as conn:
                seen = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s", [f"%{marker}%"]
                ).fetchone()[0]
                assert seen == 0, kind
        with connect_as(*logins["worker"]) as conn:
            # other sessions' waits are hidden from the login itself...
            assert (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()[0]
                == 0
            )
            # ...but the guard's function counts them, and the table's conflicting lock
            assert (
                conn.execute("SELECT lock_waits FROM guard_instance_signals()").fetchone()[0] >= 1
            )
            conflicting = conn.execute(
                "SELECT conflicting_locks FROM guard_table_signals('public.rr_events'::regclass,"
                " ARRAY['AccessExclusiveLock'])"
            ).fetchone()[0]
            assert conflicting and conflicting[0].startswith("AccessExclusiveLock by pid ")
        for kind in ("web", "operator", "monitor"):
            with connect_as(*logins[kind]) as conn:
                assert refused(conn, "SELECT * FROM guard_instance_signals()"), kind
    finally:
        holder.rollback()
        holder.close()
        waiter.join(10)
        web.close()


def test_no_login_writes_a_task_row_that_a_cluster_would_unpickle(logins):
    for kind in KINDS:
        with connect_as(*logins[kind]) as conn:
            assert refused(
                conn,
                "INSERT INTO django_q_task (id, name, func, started, stopped, success,"
                " attempt_count) VALUES ('x', 'x', 'os.system', now(), now(), true, 1)",
            ), kind


def test_the_worker_login_cannot_undo_an_operators_decision(logins, make_user):
    policy = approved_policy(make_user, **events_spec())
    oncall = make_user("oscar", "oncall")
    run, _ = trigger_run(policy, tick=NOW)
    pause_run(run, actor=oncall, reason="incident 42")
    pause_policy(policy, actor=oncall, reason="incident 42")
    with connect_as(*logins["worker"]) as conn:
        for statement in (
            "UPDATE retention_policy SET paused = false",
            "UPDATE retention_policy SET paused = false, schedule = '* * * * *'",
            "UPDATE retention_policy SET paused_reason = 'guard critical: forged'",
            "UPDATE runs_run SET state = 'active'",
            "UPDATE runs_run SET state = 'drained'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    policy.refresh_from_db()
    run.refresh_from_db()
    assert (policy.paused, policy.paused_reason, policy.schedule) == (
        True,
        "incident 42",
        "0 3 * * *",
    )
    assert run.state == "paused"
    # what the workers do need: the guard pauses an unpaused policy at a critical reading;
    # lifting it is an on-call engineer's (tests/security/test_database_functions.py)
    other = approved_policy(make_user, **events_spec(slug="other"))
    with connect_as(*logins["worker"]) as conn:
        conn.execute(
            "UPDATE retention_policy SET paused = true, paused_reason = 'guard critical: lag'"
            " WHERE id = %s",
            [other.pk],
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE retention_policy SET paused = false WHERE id = %s", [other.pk])
        # a run's cutoff never moves, whoever asks
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE runs_run SET cutoff = now()")
    with connection.cursor() as cur, pytest.raises(Exception, match="never change"):
        cur.execute("UPDATE runs_run SET cutoff = now()")


def test_no_login_but_the_web_writes_people_or_tokens(logins, make_user):
    carol = make_user("carol", "compliance")
    for kind in ("worker", "operator", "monitor"):
        with connect_as(*logins[kind]) as conn:
            assert refused(
                conn,
                "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
                " email, is_staff, is_active, date_joined) VALUES ('x', true, 'mallory', '', '',"
                " '', true, true, now())",
            ), kind
            assert refused(
                conn,
                "INSERT INTO auth_user_groups (user_id, group_id) SELECT %s, id FROM auth_group",
                [carol.pk],
            ), kind
            assert refused(
                conn,
                "INSERT INTO core_apitoken (user_id, name, prefix, digest, created_at)"
                " VALUES (%s, 'x', 'rrt_x', 'x', now())",
                [carol.pk],
            ), kind
            assert refused(conn, "UPDATE auth_user SET password = 'x'"), kind
            assert refused(conn, "DELETE FROM django_session"), kind


def test_a_person_or_token_written_with_a_database_login_alone_signs_in_nowhere(
    logins, make_user, client
):
    carol = make_user("carol", "compliance")
    _, carols_token = create_token(carol, name="laptop")
    with connect_as(*logins["web"]) as conn:
        # a new person, in the auditor group, with a password of the attacker's choosing
        conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
            " email, is_staff, is_active, date_joined) VALUES (%s, false, 'mallory', '', '', '',"
            " false, true, now())",
            [make_password("mallory-password-1")],
        )
        conn.execute(
            "INSERT INTO auth_user_groups (user_id, group_id) SELECT u.id, g.id FROM auth_user u,"
            " auth_group g WHERE u.username = 'mallory' AND g.name = 'auditor'"
        )
        # someone else's password replaced
        conn.execute(
            "UPDATE auth_user SET password = %s WHERE username = 'carol'",
            [make_password("carol-taken-over")],
        )
        # a token row with a secret of the attacker's choosing (the old unkeyed digest)
        secret = ApiToken.PREFIX + "planted-secret-of-my-choosing"
        conn.execute(
            "INSERT INTO core_apitoken (user_id, name, prefix, digest, created_at)"
            " VALUES (%s, 'x', %s, %s, now())",
            [carol.pk, secret[:12], hashlib.sha256(secret.encode()).hexdigest()],
        )
    for username, password in (("mallory", "mallory-password-1"), ("carol", "carol-taken-over")):
        page = client.post("/login/", {"username": username, "password": password})
        assert page.status_code == 200 and "_auth_user_id" not in client.session, username
    # the test can fail: a sealed account with the right password signs in
    make_user("dora", "auditor")
    assert client.post("/login/", {"username": "dora", "password": "dora-pw"}).status_code == 302
    assert roles_of(User.objects.get(username="mallory")) == frozenset()
    assert roles_of(User.objects.get(username="carol")) == frozenset()
    with pytest.raises(TokenError, match="not a known token"):
        user_for_token(secret)
    with pytest.raises(TokenError, match="changed outside the product"):
        user_for_token(carols_token)  # her own token stops working with the broken seal
    err = io.StringIO()
    with pytest.raises(CommandError, match="audit chain broken"):
        call_command("retention", "audit", "verify", stdout=io.StringIO(), stderr=err)
    named = err.getvalue()
    assert "account mallory" in named and "account carol" in named


def test_no_login_rewrites_the_audit_trail_or_the_operator_log(logins, make_user):
    policy = approved_policy(make_user, **events_spec())  # writes operator-log rows
    assert policy
    for kind in KINDS:
        with connect_as(*logins[kind]) as conn:
            for table in ("runs_auditrecord", "retention_operatoraction"):
                assert refused(conn, f"UPDATE {table} SET hash = 'x'"), (kind, table)  # noqa: S608
                assert refused(conn, f"DELETE FROM {table}"), (kind, table)  # noqa: S608
                assert refused(conn, f"TRUNCATE {table}"), (kind, table)


def test_no_login_owns_creates_or_drops_anything(logins):
    for kind in KINDS:
        with connect_as(*logins[kind]) as conn:
            for statement in (
                "DROP TABLE public.rr_events",
                "ALTER TABLE public.rr_events DISABLE TRIGGER ALL",
                "CREATE TABLE retention_runner.planted (id int)",
                "CREATE TABLE public.planted (id int)",
                "ALTER TABLE retention_runner.runs_auditrecord DISABLE TRIGGER ALL",
                "DROP FUNCTION retention_runner.rr_may_decide()",
            ):
                assert refused(conn, statement), (kind, statement)
            assert refused(conn, "TRUNCATE public.rr_events"), kind
        # and the database agrees: no ownership, memberships or CREATE anywhere
        ok, out = grants_check(kind, logins[kind][0])
        assert ok and "owns" not in out and "member of" not in out, out


def _owner_params() -> dict:
    """The test's own (owner) login, as an application's session would connect."""
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "application_name"):
        params.pop(key, None)
    return params


def _wait(predicate, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_checkpoint_job_signs_and_stores_with_the_monitor_login_alone(logins, make_user):
    """The checkpoint job (deploy/systemd/retention-checkpoint.service) runs with the monitor
    login: it reads both chains' heads and stores its checkpoint; the web login cannot store
    one, so a manifest never carries a checkpoint the pages wrote."""
    import sys

    from runs.models import Checkpoint
    from tests.runs.conftest import ROOT, worker_env
    from tests.security.roles import url_as

    pause_policy(approved_policy(make_user, **events_spec()), actor="guard", reason="chained")
    role, password = logins["monitor"]
    env = {
        **os.environ,
        **worker_env(),
        "DATABASE_URL": url_as(role, password),
        "RETENTION_EVIDENCE_KEY": "evidence-key-kept-off-the-database-host-0123456789",
    }
    done = zygote.run(
        [sys.executable, "manage.py", "retention", "audit", "checkpoint"],
        cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = Checkpoint.objects.get()
    assert stored.operator_seq > 0 and stored.signature in done.stdout

    with connect_as(*logins["web"]) as web:
        assert refused(
            web,
            "INSERT INTO runs_checkpoint (at, audit_seq, audit_hash, operator_seq,"
            " operator_hash, hmac, host) VALUES (now(), 0, '', 0, '', 'x', 'web')",
        )
