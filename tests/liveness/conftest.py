"""Liveness tests: schedules, runs and reconciler passes under real cleanup clusters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from tests.factories import approved_policy, backdate_approval, events_spec
from tests.runs.conftest import create_events, events, events_policy  # noqa: F401

# A lowered task timeout: a reconciler pass must stay well inside it.
CLUSTER_ENV = {
    "Q_CLUSTER_NAME": "cleanup",
    "RETENTION_Q_TIMEOUT": "6",
    "RETENTION_Q_RETRY": "8",
    "RETENTION_LEASE_BUDGET_S": "3",
    "RETENTION_LEASE_STALE_S": "8",
}


def drop_tables(*names: str) -> None:
    with connection.cursor() as cur:
        for name in names:
            cur.execute(f"DROP TABLE IF EXISTS public.{name}, public.{name}_shadow")


def policy_on(make_user, slug: str, table: str, *, rows: int = 600, approved_ago=None, **spec):
    """An approved policy on its own events table (``rr_<slug>``); with ``approved_ago`` its
    approval is moved back so that ticks since then count as missed."""
    create_events(rows, name=table)
    policy = approved_policy(make_user, **events_spec(slug=slug, table=table, **spec))
    if approved_ago is not None:
        from django.utils import timezone

        backdate_approval(policy, timezone.now() - approved_ago, created_too=True)
    return policy


@pytest.fixture
def day():
    return timedelta(days=1)
