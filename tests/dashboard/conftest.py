"""Fixtures for the dashboard: a user per role, a policy on a real table, runs built by the
real action functions (trigger, plan, process, drain), and a dead letter from a dropped table."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client, override_settings

from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import DeadLetter, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

ROLE_USERS = {
    "viewer": "vera",
    "oncall": "oscar",
    "auditor": "audrey",
    "compliance": "carla",
}


@pytest.fixture
def users(make_user):
    return {role: make_user(name, role) for role, name in ROLE_USERS.items()}


@pytest.fixture
def client_for(users):
    """``client_for("oncall")`` — a CSRF-enforcing client signed in with that role."""

    def make(role: str | None) -> Client:
        client = Client(enforce_csrf_checks=True)
        if role is not None:
            client.force_login(users[role])
        return client

    return make


@pytest.fixture
def events_policy(db, make_user):
    create_events(3000)
    return approved_policy(make_user, **events_spec())


def run_with_three_chunks(policy) -> Run:
    """An active run of ``policy``, planned, with three chunks committed (the guard off while
    they are: a busy machine's probe must not decide what the page under test shows)."""
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    with override_settings(RETENTION={**settings.RETENTION, "GUARD": False}):
        for _ in range(3):
            assert worker.process_one(created).kind == worker.DONE
    created.refresh_from_db()
    return created


@pytest.fixture
def run(events_policy) -> Run:
    """An active run, planned, with three chunks committed."""
    return run_with_three_chunks(events_policy)


def make_dead_letter(make_user, slug: str = "gone", rows: int = 600) -> DeadLetter:
    """A run whose table disappeared: the worker dead-letters its first chunk."""
    table = f"rr_{slug}"
    create_events(rows, name=table)
    policy = approved_policy(make_user, **events_spec(slug=slug, table=table))
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE public.{table}")
    outcome = worker.process_one(created)
    assert outcome.kind == worker.FAILED, outcome
    return DeadLetter.objects.get(run=created)


@pytest.fixture
def dead_letter(db, make_user) -> DeadLetter:
    return make_dead_letter(make_user)
