"""Fixtures for the HTTP API: a person per role (and a superuser) each with a personal API
token, a client that sends it, and a world to act on built by the real action functions."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from core.tokens import create_token
from retention import actions
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.engine import planner
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

ROLE_USERS = {"viewer": "vera", "oncall": "oscar", "auditor": "audrey", "compliance": "carla"}


class Api:
    """``api.post("/runs/k/pause", {"reason": …}, as_="oncall")`` → (status, JSON body)."""

    def __init__(self, tokens: dict[str, str]):
        self.tokens = tokens
        self.client = Client(enforce_csrf_checks=True)
        self.last = None

    def call(self, method: str, path: str, body=None, *, as_=None, token=None, headers=None):
        secret = token if token is not None else self.tokens.get(as_) if as_ else None
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
        if secret:
            extra["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
        response = self.client.generic(
            method, f"/api/v1{path}", json.dumps(body) if body is not None else "",
            content_type="application/json", **extra,
        )  # fmt: skip
        self.last = response
        kind = response.get("Content-Type", "")
        raw = b"".join(response.streaming_content) if response.streaming else response.content
        self.body = raw
        data = json.loads(raw) if kind.startswith("application/json") else None
        return response.status_code, data

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.call("POST", path, body if body is not None else {}, **kw)


def make_people(make_user) -> dict[str, User]:
    """A person per role, and the superuser ``sue``."""
    people = {role: make_user(name, role) for role, name in ROLE_USERS.items()}
    people["superuser"] = User.objects.create_superuser("sue", password="sue-pw")
    return people


def api_tokens(people: dict[str, User]) -> dict[str, str]:
    """A personal API token's secret per role."""
    return {role: create_token(user, name="api tests")[1] for role, user in people.items()}


def make_world(make_user) -> dict:
    """An approved policy ``events`` with a submitted v2 by someone else, an active planned
    run, an active hold and a requested floor on its table."""
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    author = User.objects.get(username="author-events")
    v2 = actions.apply_spec(PolicySpec.parse(events_spec(retention="25 days")), author=author)
    v2 = actions.submit_version(v2, actor=author, reason="longer")
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    hold = actions.place_hold(actor=author, reason="LIT-1", policy=policy, tenant="3")
    floor = actions.request_floor("public.rr_events", "10 days", mode="governance", actor=author,
                                  reason="LAW-1")  # fmt: skip
    return {"policy": policy, "v2": v2, "run": Run.objects.get(pk=run.pk), "hold": hold,
            "author": author, "floor": floor}  # fmt: skip


@pytest.fixture
def people(make_user):
    return make_people(make_user)


@pytest.fixture
def api(people):
    return Api(api_tokens(people))


@pytest.fixture
def world(db, make_user, people):
    """``make_world`` (a dead letter: ``tests.dashboard.conftest.make_dead_letter``)."""
    return make_world(make_user)
