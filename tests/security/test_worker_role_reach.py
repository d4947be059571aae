"""A leaked worker credential reaches nothing another process deserializes or executes:
connected as the real least-privilege role, it cannot plant a pickle that the web process
loads (sign-in, /healthz), nor make a schedule name a callable other than the product's
scheduled tasks."""

from __future__ import annotations

import base64
import os
import pickle
import signal

import psycopg
import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.db import BaseDatabaseCache
from django.db import connection
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import Schedule
from psycopg import sql

from runs.engine.schedules import ensure_system_schedules
from runs.pages.metrics import AUDIT_TOTALS_KEY
from tests.security.roles import connect_as, grant_statements

pytestmark = pytest.mark.django_db(transaction=True)

ADDRESS = "10.9.8.7"


class Planted:
    """Unpickling this creates a directory: proof that the payload ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def payload(marker) -> str:
    """A value as Django's pickling database cache stores it (base64 of a pickle)."""
    return base64.b64encode(pickle.dumps(Planted(str(marker)))).decode()


@pytest.fixture
def granted(worker_role):
    role, password = worker_role
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS public.rr_reach (id bigint PRIMARY KEY)")
        for statement in grant_statements(role, ("public", "rr_reach")):
            cur.execute(statement.as_string(cur.connection))
    yield role, password
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_reach")


def cache_tables() -> dict[str, BaseDatabaseCache]:
    return {
        name: caches[name]
        for name in settings.CACHES
        if isinstance(caches[name], BaseDatabaseCache)
    }


def plant(conn, table: str, keys: set[str], value: str) -> None:
    """Write ``value`` under every key (insert or overwrite) of a cache table."""
    for key in sorted(keys):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (cache_key, value, expires) VALUES (%s, %s, now() + interval '1 day')"
                " ON CONFLICT (cache_key) DO UPDATE SET value = EXCLUDED.value,"
                " expires = EXCLUDED.expires"
            ).format(sql.Identifier(table)),
            [key, value],
        )


def keys_the_web_reads(cache: BaseDatabaseCache) -> set[str]:
    """The metrics totals' key, django-q2's cluster-stat keys, and whatever is cached."""
    keys = {cache.make_key(AUDIT_TOTALS_KEY)}
    keys |= {cache.make_key(Conf.Q_STAT), cache.make_key(f"{Conf.Q_STAT}:planted")}
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT cache_key FROM {}")
            .format(sql.Identifier(cache._table))
            .as_string(cur.connection)
        )
        keys |= {row[0] for row in cur.fetchall()}
    return keys


def sign_in(client, password: str):
    return client.post("/login/", {"username": "alice", "password": password}, REMOTE_ADDR=ADDRESS)


def test_a_pickle_planted_as_the_worker_role_never_runs_in_the_web_process(
    client, granted, make_user, tmp_path
):
    make_user("alice", "viewer")
    assert sign_in(client, "wrong").status_code == 200  # the web path caches what it uses
    marker = tmp_path / "planted-ran"
    planted, refused = [], []
    with connect_as(*granted) as conn:
        for name, cache in cache_tables().items():
            try:
                plant(conn, cache._table, keys_the_web_reads(cache), payload(marker))
                planted.append(name)
            except psycopg.errors.InsufficientPrivilege:
                refused.append(name)
    assert get_broker().cache._table in {caches[n]._table for n in planted}  # stats are shared

    assert sign_in(client, "wrong").status_code == 200
    assert sign_in(client, "alice-pw").status_code == 302
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/").status_code == 200

    assert not marker.exists()
    # the web process's own cache (metrics totals, drain windows) is not the workers'
    assert "default" in refused


def test_the_cache_never_unpickles_what_it_reads_whoever_wrote_it(client, db, make_user, tmp_path):
    make_user("alice", "viewer")
    marker = tmp_path / "planted-ran"
    with connect_as_owner() as conn:
        for cache in cache_tables().values():
            plant(conn, cache._table, keys_the_web_reads(cache), payload(marker))

    assert sign_in(client, "alice-pw").status_code == 302
    assert client.get("/metrics").status_code == 200
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json()["clusters"] == {}
    assert not marker.exists()


def connect_as_owner() -> psycopg.Connection:
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(**params, autocommit=True)


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO django_q_schedule (name, func, schedule_type, repeats, next_run)"
        " VALUES ('x', 'os.system', 'O', 1, now())",
        "INSERT INTO django_q_schedule (name, func, hook, schedule_type, repeats, next_run)"
        " VALUES ('x', 'runs.tasks.reconcile', 'os.system', 'O', 1, now())",
        "UPDATE django_q_schedule SET func = 'os.system' WHERE name = 'retention:reconciler'",
        "UPDATE django_q_schedule SET func = 'builtins.exec', args = '(\"1\",)'",
        "UPDATE django_q_schedule SET hook = 'subprocess.run'",
    ],
)
def test_the_worker_role_cannot_schedule_any_other_callable(granted, statement):
    ensure_system_schedules()
    before = sorted(Schedule.objects.values_list("name", "func", "hook"))
    with connect_as(*granted) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(statement)
        # what the workers do need still works: re-arming the product's own schedules
        conn.execute(
            "UPDATE django_q_schedule SET next_run = %s, repeats = -1"
            " WHERE name = 'retention:reconciler'",
            [timezone.now()],
        )
    assert sorted(Schedule.objects.values_list("name", "func", "hook")) == before


@pytest.mark.processes
def test_a_cluster_running_as_the_worker_role_still_reports_its_heartbeat(client, granted):
    from tests.runs.processes import kill_group, spawn, wait_for
    from tests.security.roles import url_as

    ensure_system_schedules()
    cluster = spawn("qcluster", env={"DATABASE_URL": url_as(*granted), "Q_CLUSTER_NAME": "cleanup"})
    try:
        clusters = wait_for(
            lambda: {
                k: c
                for k, c in client.get("/healthz").json().get("clusters", {}).items()
                if c["workers"]
            },
            timeout=90,
            what="a heartbeat with its workers",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
    (beat,) = clusters.values()
    assert beat["workers"] >= 1
    assert beat["heartbeat_age_s"] is not None


def test_task_results_written_as_the_worker_role_are_never_unpickled_by_the_admin(
    client, granted, make_user, tmp_path
):
    """django-q2 keeps task arguments and results as pickles in django_q_task, which the
    workers write; the web process never loads them (no admin pages for them)."""
    marker = tmp_path / "planted-ran"
    with connect_as(*granted) as conn:
        for success in (True, False):
            conn.execute(
                "INSERT INTO django_q_task (id, name, func, args, kwargs, result, started,"
                " stopped, success, attempt_count) VALUES (%s, %s, 'runs.tasks.reconcile',"
                " %s, %s, %s, now(), now(), %s, 1)",
                [f"planted{success:d}", f"planted-{success}", *[payload(marker)] * 3, success],
            )
    ensure_system_schedules()
    Schedule.objects.filter(name="retention:reconciler").update(task="planted1")
    admin = make_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    for model in ("success", "failure"):
        client.get(f"/admin/django_q/{model}/")
        client.get(f"/admin/django_q/{model}/planted{int(model == 'success')}/change/")
    assert client.get("/admin/").status_code == 200
    schedules = client.get("/admin/django_q/schedule/")
    assert schedules.status_code == 200
    assert "planted-True" in schedules.content.decode()
    assert not marker.exists()
