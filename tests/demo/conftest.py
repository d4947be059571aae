"""Fixtures of the demo tests: a small marketplace, generated once and reused
(the generator is idempotent), dropped when the module's tests are done."""

from __future__ import annotations

import pytest
from django.db import connection

from demo.marketplace import DemoParams, LoadResult, ensure_marketplace

SMALL = DemoParams(rows=20_000, seed=42, tenants=50)


@pytest.fixture(scope="module", autouse=True)
def _drop_marketplace_afterwards(django_db_setup, django_db_blocker):
    yield
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS marketplace CASCADE")


@pytest.fixture
def marketplace(transactional_db) -> LoadResult:
    """The demo data of ``SMALL`` (generated if absent or different)."""
    return ensure_marketplace(SMALL)


def scalar(query: str, params: list | dict | None = None):
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()[0]


def checksum(table: str, columns: str = "t.*") -> str:
    """md5 over every row of ``marketplace.<table>`` in id order."""
    return scalar(
        f"SELECT md5(string_agg(md5(({columns})::text), '' ORDER BY id))"
        f" FROM marketplace.{table} AS t"
    )
