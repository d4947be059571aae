"""The product in an application's database: its tables go in a schema of its own
(``retention_runner``), beside a Django application's migrated tables in ``public`` — which
keep their users, sessions and migration history and are ordinary targets: the product
prunes the application's expired sessions. An installation from before the schema (every
table in ``public``) is moved into it by ``migrate``, data and triggers kept."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest

from signatures import keys
from tests.deploy.install import (
    ROOT,
    SIGNING_KEY,
    database_url,
    manage,
    new_database,
    production_env,
)
from tests.deploy.test_fresh_install import server_of_the_tests

pytestmark = [pytest.mark.processes]

SESSIONS_POLICY = """\
slug = "app-sessions"
name = "The application's sessions, an hour after they expire"
table = "public.django_session"
key = "session_key"
timestamp = "expire_date"
retention = "1 hours"
schedule = "0 * * * *"
timezone = "UTC"
chunk_size = 200

# chunk timeouts that fit the short task timeout of the test's deployment
[timeouts]
statement_ms = 3000
lock_ms = 500
"""

ACT = """
from django.contrib.auth.models import Group, User
from retention import actions
from retention.spec import load_toml
from runs.actions import trigger_run
alice = User.objects.create_user("alice", password="alice-password-1234")
carol = User.objects.create_user("carol", password="carol-password-1234")
for user in (alice, carol):
    user.groups.add(Group.objects.get(name="compliance"))
from django.utils import timezone
version = actions.apply_spec(load_toml(open({path!r}).read()), author=alice)
version = actions.submit_version(version, actor=alice, reason="the application's sessions")
actions.approve_version(version, actor=carol, reason="reviewed")
run, _ = trigger_run(version.policy, tick=timezone.now())
print(run.run_key)
"""


def application_migrate(env: dict) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=dict(env, DJANGO_SETTINGS_MODULE="tests.deploy.application_settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def scalar(conn, statement, params=()):
    return conn.execute(statement, params).fetchone()[0]


def test_the_product_installs_beside_a_django_application_and_prunes_its_expired_sessions(
    db, tmp_path
):
    admin = server_of_the_tests()
    with new_database(admin) as name:
        env = production_env(database_url(admin, name))
        application_migrate(env)
        with psycopg.connect(**admin, dbname=name, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO public.auth_user (password, is_superuser, username, first_name,"
                " last_name, email, is_staff, is_active, date_joined)"
                " SELECT '!', false, 'appuser' || g, '', '', '', false, true, now()"
                " FROM generate_series(1, 5) g"
            )
            # 1,200 sessions expired from 2 days ago up to 1 minute ago, 300 still valid
            conn.execute(
                "INSERT INTO public.django_session (session_key, session_data, expire_date)"
                " SELECT md5(g::text), 'x', now() - make_interval(mins => g)"
                " FROM generate_series(1, 1200) g"
                " UNION ALL SELECT md5('live' || g), 'x', now() + make_interval(days => 1)"
                " FROM generate_series(1, 300) g"
            )
            app_migrations = scalar(conn, "SELECT count(*) FROM public.django_migrations")

        manage(env, "migrate", "--no-input", "-v", "0")
        with psycopg.connect(**admin, dbname=name, autocommit=True) as conn:
            # the application's tables are untouched, the product's are its own
            assert scalar(conn, "SELECT count(*) FROM public.django_migrations") == app_migrations
            assert (
                scalar(conn, "SELECT count(*) FROM public.django_migrations WHERE app = 'runs'")
                == 0
            )
            assert scalar(conn, "SELECT count(*) FROM public.auth_user") == 5
            assert scalar(conn, "SELECT count(*) FROM retention_runner.auth_user") == 0
            assert (
                scalar(
                    conn,
                    "SELECT count(*) FROM retention_runner.django_migrations WHERE app = 'runs'",
                )
                > 0
            )
            assert (
                scalar(
                    conn,
                    "SELECT count(*) FROM retention_runner.auth_group WHERE name = 'compliance'",
                )
                == 1
            )
            # the sessions as they are before the run: which of them its cutoff reaches is
            # judged on this copy, whenever the run's tick falls
            conn.execute(
                "CREATE TABLE public.rr_sessions_before AS"
                " SELECT session_key, expire_date FROM public.django_session"
            )

        policy = tmp_path / "sessions.toml"
        policy.write_text(SESSIONS_POLICY)
        # the decisions are made as the web host makes them: it alone holds the signing key
        web_env = dict(env, RETENTION_SIGNING_KEY=keys.private_text(SIGNING_KEY))
        out = manage(web_env, "shell", "-c", ACT.format(path=str(policy))).stdout
        run_key = out.strip().splitlines()[-1]
        manage(env, "retention", "drain", run_key, "--until-idle", "--budget", "30")

        with psycopg.connect(**admin, dbname=name, autocommit=True) as conn:
            state, tick, cutoff = conn.execute(
                "SELECT state, tick, cutoff FROM retention_runner.runs_run WHERE run_key = %s",
                [run_key],
            ).fetchone()
            assert state == "drained"
            assert cutoff == tick - timedelta(hours=1)  # the cutoff is the tick's
            assert (
                scalar(
                    conn,
                    "SELECT count(*) FROM public.django_session WHERE expire_date < %s",
                    [cutoff],
                )
                == 0
            )
            # every valid session and every session expired within the retention is left
            assert scalar(conn, "SELECT count(*) FROM public.django_session") == 1500 - scalar(
                conn,
                "SELECT coalesce(sum(rows_deleted), 0) FROM retention_runner.runs_auditrecord",
            )
            assert (
                scalar(conn, "SELECT count(*) FROM public.django_session WHERE expire_date > now()")
                == 300
            )
            deleted = scalar(
                conn, "SELECT sum(rows_deleted) FROM retention_runner.runs_auditrecord"
            )
            # exactly the sessions below the cutoff when the run began
            assert deleted == scalar(
                conn,
                "SELECT count(*) FROM public.rr_sessions_before WHERE expire_date < %s",
                [cutoff],
            )
            assert scalar(conn, "SELECT count(*) FROM public.auth_user") == 5


def test_an_installation_with_its_tables_in_public_is_moved_into_its_schema_by_migrate(db):
    admin = server_of_the_tests()
    with new_database(admin) as name:
        env = production_env(database_url(admin, name))
        manage(dict(env, RETENTION_SCHEMA="public"), "migrate", "--no-input", "-v", "0")
        manage(
            dict(env, RETENTION_SCHEMA="public", DJANGO_SUPERUSER_PASSWORD="root-password-1234"),
            "createsuperuser", "--no-input", "--username", "root", "--email", "r@example.com",
        )  # fmt: skip
        with psycopg.connect(**admin, dbname=name, autocommit=True) as conn:
            assert scalar(conn, "SELECT to_regclass('public.runs_auditrecord') IS NOT NULL")

        out = manage(env, "migrate", "--no-input").stdout
        assert "moved" in out and "from public to retention_runner" in out
        with psycopg.connect(**admin, dbname=name, autocommit=True) as conn:
            left = scalar(
                conn,
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind = 'r'",
            )
            assert left == 0
            assert scalar(conn, "SELECT username FROM retention_runner.auth_user") == "root"
            assert scalar(
                conn,
                "SELECT to_regprocedure('retention_runner.runs_try_slot(integer, integer[])') IS NOT NULL",
            )
            # the append-only triggers of the audit trail, the operator log and the
            # checkpoints moved with their tables and function
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT c.relname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
                    " JOIN pg_class c ON c.oid = t.tgrelid"
                    " JOIN pg_namespace n ON n.oid = p.pronamespace"
                    " JOIN pg_namespace tn ON tn.oid = c.relnamespace"
                    " WHERE NOT t.tgisinternal AND p.proname = 'runs_audit_append_only'"
                    " AND n.nspname = 'retention_runner' AND tn.nspname = 'retention_runner'"
                    " ORDER BY 1"
                )
                assert [r[0] for r in cur.fetchall()] == [
                    "retention_operatoraction",
                    "runs_auditrecord",
                    "runs_checkpoint",
                ]
        # the moved installation migrates again as a no-op
        assert "No migrations to apply" in manage(env, "migrate", "--no-input").stdout
