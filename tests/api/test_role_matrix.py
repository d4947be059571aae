"""Every endpoint × every role: allowed (whatever the action then says, never 401/403),
403 ``forbidden`` for a role it does not serve, 401 without a token and with a revoked one.
The list below is checked against the served schema, so a new endpoint without a line here
fails. Then every endpoint that takes ``If-Match`` refuses a decision on a state that moved on
(412), and every four-eyes decision refuses the person who wrote or asked for it (403)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core.models import OperatorAction
from core.tokens import create_token, revoke_token
from retention import actions as release
from runs import actions as run_actions
from tests.api.conftest import Api, api_tokens, make_people, make_world
from tests.conftest import create_user, fresh
from tests.dashboard.conftest import make_dead_letter

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def built(build_once):
    """The people, their tokens, the world and a dead letter, once for the module
    (``tests.conftest.build_once``): each test acts on them in a savepoint rolled back after it."""

    def build():
        people = make_people(create_user)
        return {
            "people": people,
            "tokens": api_tokens(people),
            "world": make_world(create_user),
            "letter": make_dead_letter(create_user),
        }

    return build_once(build)


@pytest.fixture
def people(built, db):
    return fresh(built["people"])


@pytest.fixture
def api(built, db):
    return Api(built["tokens"])


@pytest.fixture
def world(built, db):
    return fresh(built["world"])


ALL = frozenset({"viewer", "oncall", "auditor", "compliance", "superuser"})
C = frozenset({"compliance", "superuser"})
O = frozenset({"oncall", "superuser"})  # noqa: E741
A = frozenset({"auditor", "compliance", "superuser"})
SU = frozenset({"superuser"})
PASSWORDS = {"viewer": "vera-pw", "oncall": "oscar-pw", "auditor": "audrey-pw",
             "compliance": "carla-pw", "superuser": "sue-pw"}  # fmt: skip

TOML = Path(__file__).with_name("events.toml")


def files(reason: str | None = None) -> dict:
    body = {"files": [{"name": "events.toml", "toml": TOML.read_text()}]}
    return body if reason is None else {**body, "reason": reason}


R = {"reason": "INC-7 matrix"}
# (method, path template as served, path, body(role), roles it serves)
ENDPOINTS = [
    ("GET", "/policies", "/policies", None, ALL),
    ("POST", "/policies", "/policies", lambda r: {"toml": TOML.read_text(), **R}, C),
    ("POST", "/policy-files/plan", "/policy-files/plan", lambda r: files(), C),
    ("POST", "/policy-files/apply", "/policy-files/apply", lambda r: files("matrix"), C),
    ("POST", "/policy-files/pull", "/policy-files/pull", lambda r: {"dir": "p", "files": []}, ALL),
    ("GET", "/policies/{slug}", "/policies/events", None, ALL),
    ("GET", "/policies/{slug}/file", "/policies/events/file", None, ALL),
    ("GET", "/policies/{slug}/preview", "/policies/events/preview", None, C),
    ("GET", "/policies/{slug}/versions/{number}", "/policies/events/versions/2", None, ALL),
    ("GET", "/policies/{slug}/versions/{number}/diff", "/policies/events/versions/2/diff", None,
     ALL),
    ("POST", "/policies/{slug}/versions/{number}/approve", "/policies/events/versions/2/approve",
     lambda r: {**R, "password": PASSWORDS[r]}, C),
    ("POST", "/policies/{slug}/versions/{number}/reject", "/policies/events/versions/2/reject",
     lambda r: R, C),
    ("POST", "/policies/{slug}/enable", "/policies/events/enable", lambda r: R, O),
    ("POST", "/policies/{slug}/disable", "/policies/events/disable", lambda r: R, O),
    ("POST", "/policies/{slug}/pause", "/policies/events/pause", lambda r: R, O),
    ("POST", "/policies/{slug}/resume", "/policies/events/resume", lambda r: R, O),
    ("GET", "/holds", "/holds", None, ALL),
    ("POST", "/holds", "/holds", lambda r: {**R, "policy": "events", "tenant": ["2"]}, C),
    ("GET", "/holds/{hold_id}", "/holds/{hold}", None, ALL),
    ("POST", "/holds/{hold_id}/release", "/holds/{hold}/release", lambda r: R, C),
    ("POST", "/holds/{hold_id}/approve-release", "/holds/{hold}/approve-release",
     lambda r: {**R, "password": PASSWORDS[r]}, C),
    ("POST", "/holds/{hold_id}/withdraw-release", "/holds/{hold}/withdraw-release", lambda r: R,
     C),
    ("POST", "/holds/{hold_id}/refuse-release", "/holds/{hold}/refuse-release", lambda r: R, C),
    ("GET", "/floors", "/floors", None, ALL),
    ("POST", "/floors", "/floors", lambda r: {**R, "table": "public.rr_events", "period": "1 year",
                                               "mode": "governance"}, C),
    ("GET", "/floors/{floor_id}", "/floors/{floor}", None, ALL),
    ("POST", "/floors/{floor_id}/approve", "/floors/{floor}/approve", lambda r: R, C),
    ("POST", "/floors/{floor_id}/refuse", "/floors/{floor}/refuse", lambda r: R, C),
    ("GET", "/runs", "/runs", None, ALL),
    ("POST", "/runs", "/runs", lambda r: {"policy": "events"}, O),
    ("GET", "/runs/{key}", "/runs/{run}", None, ALL),
    ("POST", "/runs/{key}/pause", "/runs/{run}/pause", lambda r: R, O),
    ("POST", "/runs/{key}/resume", "/runs/{run}/resume", lambda r: R, O),
    ("POST", "/runs/{key}/cancel", "/runs/{run}/cancel", lambda r: R, O),
    ("POST", "/runs/{key}/confirm", "/runs/{run}/confirm", lambda r: R, O),
    ("POST", "/runs/{key}/retry", "/runs/{run}/retry", lambda r: R, O),
    ("GET", "/listings/runs", "/listings/runs", None, ALL),
    ("GET", "/listings/dead-letters", "/listings/dead-letters", None, ALL),
    ("POST", "/dead-letters/replay", "/dead-letters/replay", lambda r: {**R, "ids": []}, O),
    ("POST", "/dead-letters/discard", "/dead-letters/discard", lambda r: {**R, "ids": []}, O),
    ("POST", "/runs/{key}/check", "/runs/{run}/check", lambda r: {}, A),
    ("GET", "/runs/{key}/manifest.json", "/runs/{run}/manifest.json", None, A),
    ("GET", "/policies/{slug}/manifest.json", "/policies/events/manifest.json", None, A),
    ("GET", "/dead-letters", "/dead-letters", None, ALL),
    ("POST", "/dead-letters/{letter_id}/replay", "/dead-letters/{letter}/replay", lambda r: R, O),
    ("POST", "/dead-letters/{letter_id}/discard", "/dead-letters/{letter}/discard", lambda r: R,
     O),
    ("GET", "/kill-switch", "/kill-switch", None, ALL),
    ("POST", "/kill-switch", "/kill-switch", lambda r: {"state": "on", **R}, O),
    ("POST", "/audit/verify", "/audit/verify", lambda r: {}, A),
    ("GET", "/audit/checkpoint", "/audit/checkpoint", None, A),
    ("GET", "/audit/export.csv", "/audit/export.csv", None, A),
    ("GET", "/me", "/me", None, ALL),
    ("GET", "/roles", "/roles", None, ALL),
    ("POST", "/roles/grant", "/roles/grant", lambda r: {"username": "vera", "role": "auditor",
                                                        **R, "password": PASSWORDS[r]}, SU),
    ("POST", "/roles/revoke", "/roles/revoke", lambda r: {"username": "vera", "role": "viewer",
                                                          **R, "password": PASSWORDS[r]}, SU),
    ("POST", "/users", "/users", lambda r: {"username": f"new-{r}",
                                            "password": "a long new password 42",
                                            "actor_password": PASSWORDS[r]}, SU),
    ("GET", "/targets", "/targets", None, ALL),
    ("POST", "/targets", "/targets", lambda r: {"name": f"t-{r}", "dsn_env": "RR_MATRIX_UNSET"},
     O),
    ("POST", "/targets/{name}/remove", "/targets/nowhere/remove", lambda r: R, O),
    ("GET", "/tokens", "/tokens", None, ALL),
    ("POST", "/tokens/{token_id}/revoke", "/tokens/{spare}/revoke", None, ALL),
]  # fmt: skip


def test_the_matrix_lists_every_endpoint_the_schema_serves(api):
    status, schema = api.get("/openapi.json", as_="viewer")
    assert status == 200
    served = {
        (method.upper(), re.sub(r"^/api/v1", "", path))
        for path, operations in schema["paths"].items()
        for method in operations
    }
    listed = {(method, template) for method, template, *_ in ENDPOINTS}
    assert served == listed


@pytest.mark.parametrize(
    "method,template,path,body,allowed", ENDPOINTS, ids=[f"{m} {t}" for m, t, *_ in ENDPOINTS]
)
def test_each_role_is_served_or_refused(api, built, world, people, method, template, path, body,
                                        allowed):  # fmt: skip
    letter = built["letter"] if "{letter}" in path else None
    spare = {role: create_token(user, name="spare")[0] for role, user in people.items()}

    def url(role: str | None = None) -> str:
        return (
            path.replace("{run}", world["run"].run_key)
            .replace("{hold}", str(world["hold"].pk))
            .replace("{floor}", str(world["floor"].pk))
            .replace("{letter}", str(letter.pk) if letter else "")
            .replace("{spare}", str(spare[role or "viewer"].pk))
        )

    def call(role=None, token=None):
        return api.call(method, url(role), body(role or "viewer") if body else None, as_=role,
                        token=token)  # fmt: skip

    status, error = call()
    assert (status, error["code"]) == (401, "unauthenticated")

    revoked_token, revoked_secret = create_token(people["superuser"], name="revoked")
    revoke_token(revoked_token, actor=people["superuser"])
    status, error = call(token=revoked_secret)
    assert (status, error["code"]) == (401, "token_refused")
    assert "revoked" in error["message"]

    for role in ("viewer", "oncall", "auditor", "compliance", "superuser"):
        status, data = call(role)
        if role in allowed:
            assert status not in (401, 403), (role, status, data)
        else:
            assert (status, data["code"]) == (403, "forbidden"), (role, status, data)


def test_the_served_schema_is_the_checked_in_one(api):
    checked_in = json.loads(Path(__file__).resolve().parents[2].joinpath("api/openapi.json")
                            .read_text())  # fmt: skip
    status, served = api.get("/openapi.json", as_="viewer")
    assert status == 200
    assert served == checked_in, (
        "the API changed: regenerate api/openapi.json (api/main.py says how) and review the diff"
    )


def test_the_browsable_docs_are_served_from_the_product_itself(api):
    status, _ = api.get("/docs", as_="viewer")
    html = api.body.decode()
    assert status == 200 and "swagger" in html.lower()
    assert "/static/ninja/" in html and "cdn." not in html  # no third-party script


def _move_run(world, other):
    run_actions.pause_run(world["run"], actor=other["oncall"], reason="meanwhile")
    run_actions.resume_run(world["run"], actor=other["oncall"], reason="meanwhile")


def _move_hold(world, other):
    release.request_hold_release(world["hold"], actor=other["compliance"], reason="meanwhile")
    release.withdraw_hold_release(world["hold"], actor=other["compliance"], reason="meanwhile")


def _move_switch(world, other):
    run_actions.set_kill_switch(True, actor=other["oncall"], reason="meanwhile")
    run_actions.set_kill_switch(False, actor=other["oncall"], reason="meanwhile")


def _move_policy(world, other):
    release.pause_policy(world["policy"], actor=other["oncall"], reason="meanwhile")
    release.resume_policy(world["policy"], actor=other["oncall"], reason="meanwhile")


def _move_version(world, other):
    release.reject_version(world["v2"], actor=other["compliance"], reason="meanwhile")


# every endpoint that takes If-Match: (the GET that gives the ETag, the POST, its body, who
# acts, how the target moves on meanwhile)
FENCED = [
    ("/runs/{run}", "/runs/{run}/pause", R, "oncall", _move_run),
    ("/runs/{run}", "/runs/{run}/resume", R, "oncall", _move_run),
    ("/runs/{run}", "/runs/{run}/cancel", R, "oncall", _move_run),
    ("/runs/{run}", "/runs/{run}/confirm", R, "oncall", _move_run),
    ("/holds/{hold}", "/holds/{hold}/release", R, "compliance", _move_hold),
    ("/holds/{hold}", "/holds/{hold}/approve-release", {**R, "password": "carla-pw"},
     "compliance", _move_hold),
    ("/holds/{hold}", "/holds/{hold}/withdraw-release", R, "compliance", _move_hold),
    ("/holds/{hold}", "/holds/{hold}/refuse-release", R, "compliance", _move_hold),
    ("/kill-switch", "/kill-switch", {"state": "on", **R}, "oncall", _move_switch),
    ("/policies/events", "/policies/events/pause", R, "oncall", _move_policy),
    ("/policies/events", "/policies/events/resume", R, "oncall", _move_policy),
    ("/policies/events", "/policies/events/disable", R, "oncall", _move_policy),
    ("/policies/events", "/policies/events/enable", R, "oncall", _move_policy),
    ("/policies/events/versions/2", "/policies/events/versions/2/approve",
     {**R, "password": "carla-pw"}, "compliance", _move_version),
    ("/policies/events/versions/2", "/policies/events/versions/2/reject", R, "compliance",
     _move_version),
]  # fmt: skip


@pytest.mark.parametrize("read,path,body,role,move", FENCED, ids=[f[1] for f in FENCED])
def test_a_decision_on_a_state_that_moved_on_is_refused_and_changes_nothing(
    api, world, make_user, read, path, body, role, move
):
    def url(p: str) -> str:
        return p.replace("{run}", world["run"].run_key).replace("{hold}", str(world["hold"].pk))

    status, _ = api.get(url(read), as_=role)
    stale = api.last["ETag"]
    assert status == 200 and stale
    move(
        world,
        {"oncall": make_user("olga", "oncall"), "compliance": make_user("cora", "compliance")},
    )
    before = OperatorAction.objects.count()

    status, error = api.post(url(path), body, as_=role, headers={"If-Match": stale})

    assert (status, error["code"]) == (412, "stale_state"), error
    assert OperatorAction.objects.count() == before


# four eyes: (the POST, its body, who acts as the person who wrote or asked for it)
FOUR_EYES = [
    ("/policies/events/versions/2/approve", {**R, "password": "author-events-pw"}),
    ("/policies/events/versions/2/reject", R),
    ("/holds/{hold}/approve-release", {**R, "password": "author-events-pw"}),
    ("/holds/{hold}/refuse-release", R),
    ("/floors/{floor}/approve", R),
]


@pytest.mark.parametrize("path,body", FOUR_EYES, ids=[f[0] for f in FOUR_EYES])
def test_the_person_who_wrote_or_asked_cannot_decide(api, world, path, body):
    author = world["author"]  # wrote and submitted v2, asked for the floor; asks for the hold's
    # release here
    release.request_hold_release(world["hold"], actor=author, reason="settled")
    _, secret = create_token(author, name="own decision")
    before = OperatorAction.objects.count()

    status, error = api.post(
        path.replace("{hold}", str(world["hold"].pk)).replace("{floor}", str(world["floor"].pk)),
        body,
        token=secret,
    )

    assert (status, error["code"]) == (403, "four_eyes"), error
    assert "cannot" in error["message"]
    assert OperatorAction.objects.count() == before
