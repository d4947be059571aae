"""Fixtures for policies: users in their roles, a target table, policy files, a second connection."""

from __future__ import annotations

import textwrap

import psycopg
import pytest
from django.db import connection

EVENTS_ROWS = 2000  # one row per hour, going back from now


@pytest.fixture
def alice(make_user):
    """A compliance officer who writes policies."""
    return make_user("alice", "compliance")


@pytest.fixture
def bob(make_user):
    """A second compliance officer who approves them."""
    return make_user("bob", "compliance")


@pytest.fixture
def olga(make_user):
    return make_user("olga", "oncall")


@pytest.fixture
def vera(make_user):
    return make_user("vera", "viewer")


def _create_events(cur) -> None:
    cur.execute(
        """
        CREATE TABLE public.t_events (
            id bigint PRIMARY KEY,
            tenant_id int NOT NULL,
            occurred_at timestamptz NOT NULL,
            status text
        );
        CREATE INDEX t_events_tenant_id ON public.t_events (tenant_id, id);
        INSERT INTO public.t_events (id, tenant_id, occurred_at, status)
        SELECT i, 1 + i %% 5, now() - i * interval '1 hour',
               CASE i %% 4 WHEN 0 THEN 'open' WHEN 1 THEN 'legal' WHEN 2 THEN 'closed' END
        FROM generate_series(1, %s) AS i;
        ANALYZE public.t_events;
        """,
        [EVENTS_ROWS],
    )


def create_events_table() -> str:
    """``public.t_events``: 2000 rows, one an hour back from now, tenants 1-5,
    status cycling open/legal/closed/NULL; index (tenant_id, id)."""
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.t_events CASCADE")
        _create_events(cur)
    return "public.t_events"


@pytest.fixture
def events_table(db):
    """``create_events_table``, dropped after the test."""
    yield create_events_table()
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.t_events CASCADE")


def count_rows(where: str = "TRUE", params=()) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM public.t_events WHERE {where}", list(params))
        return cur.fetchone()[0]


def policy_toml(**overrides) -> str:
    """A valid policy file for t_events; keyword arguments replace or add top-level lines."""
    values = {
        "slug": '"events"',
        "name": '"Old events"',
        "table": '"public.t_events"',
        "key": '"id"',
        "timestamp": '"occurred_at"',
        "tenant": '"tenant_id"',
        "retention": '"30 days"',
        "schedule": '"0 3 * * *"',
        "timezone": '"Europe/Berlin"',
        "chunk_size": "500",
    }
    tables = overrides.pop("tables", "")
    for key, value in overrides.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    body = "\n".join(f"{k} = {v}" for k, v in values.items())
    return body + "\n" + textwrap.dedent(tables)


@pytest.fixture
def write_policy(tmp_path):
    """``write_policy(**overrides)`` → path of a TOML policy file."""
    counter = iter(range(1000))

    def write(text: str | None = None, **overrides) -> str:
        path = tmp_path / f"policy-{next(counter)}.toml"
        path.write_text(text if text is not None else policy_toml(**overrides))
        return str(path)

    return write


def second_dsn() -> str:
    """A libpq DSN for an independent connection to the test database."""
    params = connection.get_connection_params()
    parts = {
        "dbname": params["dbname"],
        "user": params.get("user") or "",
        "host": params.get("host") or "",
        "port": params.get("port") or "",
        "password": params.get("password") or "",
        # the product's schema first on the search path, as Django's own connections
        "options": params.get("options") or "",
    }
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in parts.items() if v})


@pytest.fixture
def second_connection(transactional_db):
    """A real second PostgreSQL connection (not autocommit) to the same test database."""
    conn = psycopg.connect(second_dsn())
    yield conn
    conn.rollback()
    conn.close()
