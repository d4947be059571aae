"""A leaked worker credential reaches nothing another process deserializes or executes:
connected as the real least-privilege role, it cannot plant a pickle that the web process
loads (sign-in, /healthz), nor make a schedule name a callable other than the product's
scheduled tasks."""

from __future__ import annotations

import base64
import json
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
from tests.security.roles import apply_grants, connect_as

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
        apply_grants("worker", role, "public.rr_reach")
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


def test_the_worker_role_cannot_write_a_task_result_that_a_cluster_would_unpickle(granted):
    """django-q2's monitor loads rows of django_q_task (their args and results are pickles)
    when it saves a result: the workers' login may not write that table at all."""
    for statement in (
        "INSERT INTO django_q_task (id, name, func, args, kwargs, result, started, stopped,"
        " success, attempt_count) VALUES ('planted', 'planted', 'runs.tasks.reconcile', %s, %s,"
        " %s, now(), now(), true, 1)",
        "UPDATE django_q_task SET result = %s, args = %s, kwargs = %s",
    ):
        with connect_as(*granted) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement, [payload("/tmp/never")] * 3)


@pytest.mark.processes
def test_a_cluster_as_the_worker_role_keeps_results_as_signed_json_in_the_cluster_cache(
    granted, tmp_path
):
    """A real cleanup cluster connected as the worker login saves each finished task in the
    cluster cache (a signed package, stored as JSON) and writes nothing to django_q_task; a
    pickle planted where it would be read (by the owner, since the workers cannot) never runs."""
    from django_q.models import Task
    from django_q.tasks import async_task

    from tests.runs.processes import kill_group, spawn, task_outcomes, wait_for
    from tests.security.roles import url_as

    marker = tmp_path / "planted-ran"
    with connect_as_owner() as owner:  # the one login that may still write django_q_task
        owner.execute(
            "INSERT INTO django_q_task (id, name, func, args, kwargs, result, started, stopped,"
            " success, attempt_count) VALUES ('planted', 'planted', 'runs.tasks.reconcile', %s,"
            " %s, %s, now(), now(), true, 1)",
            [payload(marker)] * 3,
        )
    ids = [async_task("runs.tasks.reconcile", cluster="cleanup") for _ in range(3)]
    cluster = spawn("qcluster", env={"DATABASE_URL": url_as(*granted), "Q_CLUSTER_NAME": "cleanup"})
    try:
        done = wait_for(
            lambda: len(task_outcomes(ids, "cleanup")) == 3 and task_outcomes(ids, "cleanup"),
            timeout=90,
            what="three reconciler tasks to finish",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
    assert all(task.success for task in done.values())
    assert list(Task.objects.values_list("id", flat=True)) == ["planted"]
    with connection.cursor() as cur:
        cur.execute("SELECT value FROM core_cluster_cache WHERE cache_key LIKE %s", ["%" + ids[0]])
        (stored,) = cur.fetchone()
    assert json.loads(stored).count(":") >= 2  # a signed string (payload:signature), not a pickle
    assert not marker.exists()
