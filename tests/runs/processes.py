"""Real worker processes for the failure-boundary tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future

import psycopg
from django.db import connection

from tests.runs.conftest import ROOT, manage, worker_env


def pg_connect(
    autocommit: bool = True, application_name: str = "test-foreground"
) -> psycopg.Connection:
    """A second, independent connection to the test database (by default it looks like
    foreground traffic to the guard, not like one of the product's own sessions)."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params["application_name"] = application_name
    return psycopg.connect(**params, autocommit=autocommit)


def spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, **worker_env(), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def manage_at_once(
    *commands: tuple[str, ...], env: dict | None = None, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Start every ``manage.py`` command at once, each a real process of its own (forked from
    the test process's zygote: tests/zygote.py), and wait for them all; their results in the
    order given. For commands whose outcome, not whose process, the test is about: a process
    the test signals or kills is started with ``spawn``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        started = [pool.submit(manage, *args, env=env, timeout=timeout) for args in commands]
        return [future.result() for future in started]


def manage_in_background(
    *args: str, env: dict | None = None, timeout: float = 300
) -> Future[subprocess.CompletedProcess]:
    """Start a ``manage.py`` command, a real process of its own (forked from the test process's
    zygote: tests/zygote.py), and let the test go on while it runs; its result when it ends
    (killed after ``timeout`` seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(manage, *args, env=env, timeout=timeout)
    finally:
        pool.shutdown(wait=False)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """SIGKILL: the whole process group dies at once (a crash). SIGTERM: to the main PID only,
    as a supervisor must signal qcluster (a group-wide SIGTERM can hang it), then the
    group is cleaned up."""
    try:
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def wait_for(predicate, *, timeout: float = 60, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    if callable(what):  # a message that describes the state at the time out
        what = what()
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def drain_past_an_open_write(application: psycopg.Connection, run_id: int) -> None:
    """Drain run ``run_id`` in a thread while ``application`` holds an uncommitted write the
    run's chunk will wait on; once a chunk waits on it (a row or transaction lock), commit the
    write and let the drain finish."""
    from concurrent.futures import ThreadPoolExecutor

    from runs.engine import worker
    from tests.runs.test_decision_fence import in_thread

    with pg_connect() as observer, ThreadPoolExecutor(max_workers=1) as pool:
        drain = pool.submit(in_thread(lambda: worker.drain(run_id, budget_s=120)))
        wait_for(
            lambda: observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event IN ('tuple', 'transactionid')"
            ).fetchone()[0],
            what="the chunk to wait on the application's write",
        )
        application.commit()
        drain.result(timeout=120)


def backends_waiting_on_delete(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query ILIKE %s",
        [f"DELETE FROM%{table}%"],
    ).fetchone()
    return row[0]


def backends_running(conn: psycopg.Connection, pattern: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND state <> 'idle' AND query ILIKE %s",
        [pattern],
    ).fetchone()
    return row[0]


def task_outcomes(ids, cluster: str) -> dict:
    """id -> django-q2 Task (``success``, ``result``, ``cluster``) of the finished tasks among
    ``ids`` that ``cluster`` ran, read where the clusters keep results: the cluster cache
    (settings.Q_CLUSTER "cached"), under the cluster's own key."""
    from django_q.brokers import get_broker
    from django_q.tasks import fetch_cached

    broker = get_broker(list_key=cluster)
    outcomes = {}
    for task_id in ids:
        task = fetch_cached(task_id, broker=broker)
        if task is not None:
            outcomes[task_id] = task
    return outcomes


def finished_tasks(cluster: str) -> list:
    """Every finished django-q2 task whose result ``cluster`` still keeps in the cluster cache
    (settings.Q_CLUSTER "cached"), as django-q2 Task objects."""
    from django.core.cache import caches
    from django.db import connection
    from django_q.brokers import get_broker

    # django-q2 keys a result by its broker's list key (the cluster's name; with Redis
    # "django_q:<name>:q")
    prefix = caches["cluster"].make_key(f"{get_broker(list_key=cluster).list_key}:")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT cache_key FROM core_cluster_cache WHERE cache_key LIKE %s",
            [prefix.replace("%", "\\%").replace("_", "\\_") + "%"],
        )
        ids = [key[len(prefix) :] for (key,) in cursor.fetchall()]
    return list(task_outcomes([i for i in ids if ":" not in i], cluster).values())
