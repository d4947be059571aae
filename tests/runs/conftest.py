"""Fixtures for the run engine: a real events table with a shadow copy, and approved policies."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from tests import zygote
from tests.factories import approved_policy, events_spec

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def create_events(rows: int, *, tenants: int = 5, name: str = "rr_events", days: int = 40) -> None:
    """``public.<name>``: ids increase with time over ``days`` days before NOW; tenant 1 holds
    about 40%; every 17th row is 'disputed' (kept by the test policies). Shadow copy beside it."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}, public.{name}_shadow")
        cur.execute(
            f"""CREATE TABLE public.{name} (
                id bigint PRIMARY KEY, tenant_id int NOT NULL, occurred_at timestamptz NOT NULL,
                status text, payload text)"""
        )
        cur.execute(
            f"""INSERT INTO public.{name}
                SELECT g,
                       CASE WHEN g %% 5 < 2 THEN 1 ELSE 2 + (g %% {max(1, tenants - 1)}) END,
                       %s::timestamptz - make_interval(secs => ({days} * 86400.0) * (1 - g::float8 / %s)),
                       CASE WHEN g %% 17 = 0 THEN 'disputed' WHEN g %% 29 = 0 THEN NULL ELSE 'closed' END,
                       repeat('x', 60)
                FROM generate_series(1, %s) AS g""",
            [NOW, rows, rows],
        )
        cur.execute(f"CREATE INDEX ON public.{name} (tenant_id, id)")
        cur.execute(f"CREATE INDEX ON public.{name} (occurred_at)")
        cur.execute(f"CREATE TABLE public.{name}_shadow AS SELECT * FROM public.{name}")
        cur.execute(f"ANALYZE public.{name}")
        cur.execute(f"ANALYZE public.{name}_shadow")


def pin_one_eligible_row(chunk, cutoff) -> None:
    """A schema change after approval: ``rr_child`` (created here, ``ON DELETE RESTRICT``)
    references one eligible row of ``chunk`` of an ``rr_events`` run, so its DELETE fails with
    a foreign-key violation (SQLSTATE 23503). The caller drops ``rr_child``."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_child (event_id bigint REFERENCES public.rr_events (id)"
            " ON DELETE RESTRICT)"
        )
        cur.execute(
            "INSERT INTO public.rr_child SELECT max(id) FROM public.rr_events"
            " WHERE id >= %s AND id < %s AND tenant_id::text = %s AND status = 'closed'"
            " AND occurred_at < %s",
            [chunk.key_from, chunk.key_to, chunk.tenant, cutoff],
        )


def count(table: str, where: str = "TRUE", params=None) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table} WHERE {where}", params or [])
        return cur.fetchone()[0]


@pytest.fixture
def events(db):
    create_events(3000)
    yield "rr_events"


@pytest.fixture
def events_policy(events, make_user):
    """Approved: delete rr_events older than 20 days, keep 'disputed', per tenant, chunks of 200."""
    return approved_policy(make_user, **events_spec())


def manage(
    *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a new process against the test database (forked from the test
    process's zygote: tests/zygote.py)."""
    full_env = dict(os.environ, **worker_env(), **(env or {}))
    return zygote.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full_env, timeout=timeout)


def worker_env() -> dict:
    """Environment that points a child process at this test database."""
    params = connection.settings_dict
    host = params["HOST"] or ""
    url = f"postgresql://{params['USER'] or 'postgres'}@/{params['NAME']}"
    query = []
    if host.startswith("/"):
        query.append(f"host={host}")
    else:
        url = f"postgresql://{params['USER'] or 'postgres'}@{host}:{params['PORT'] or 5432}/{params['NAME']}"
    if params.get("PORT") and host.startswith("/"):
        query.append(f"port={params['PORT']}")
    if query:
        url += "?" + "&".join(query)
    return {"DATABASE_URL": url, "RETENTION_DEMO": "1", "DEBUG": "0"}


def tick_at(days_ago: float = 0) -> datetime:
    return NOW - timedelta(days=days_ago)
