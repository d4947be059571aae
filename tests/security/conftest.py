"""The run engine's fixtures (an events table with a shadow copy, an approved policy), and a
real least-privilege worker role to connect as (dropped afterwards)."""

from __future__ import annotations

import os
import secrets

import pytest
from django.db import connection
from psycopg import sql

from tests.api.conftest import api, people  # noqa: F401
from tests.runs.conftest import events, events_policy  # noqa: F401


@pytest.fixture
def worker_role():
    role = f"rr_worker_{os.getpid()}_{secrets.token_hex(3)}"
    password = secrets.token_urlsafe(16)
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}")
            .format(sql.Identifier(role), sql.Literal(password))
            .as_string(cur.connection)
        )
    yield role, password
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)).as_string(cur.connection)
        )
        cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)).as_string(cur.connection))
