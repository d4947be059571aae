"""Malformed input answers one JSON error — 400 or 422 ``{"code", "message"}`` — never a
500, and changes nothing: a NUL character in a run key, a slug or a filter, an integer past
``bigint``, a period before any run could be. Then every endpoint of the role matrix, each of
its path parameters, query parameters and body fields replaced by hostile values (hypothesis:
NUL characters, huge integers, extreme dates, long and odd text)."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retention.models import LegalHold
from runs.models import Run
from tests.api.conftest import Api, api_tokens, make_people, make_world
from tests.conftest import create_user, fresh

from .test_role_matrix import ENDPOINTS

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def built(build_once):
    """The people, their tokens and the world, once for the module
    (``tests.conftest.build_once``): each test, and each endpoint's hypothesis examples, act on
    them in a savepoint rolled back after the test. The world costs more than an endpoint's
    dozen requests: built per test, it was most of this file's time."""

    def build():
        people = make_people(create_user)
        return {"tokens": api_tokens(people), "world": make_world(create_user)}

    return build_once(build)


@pytest.fixture
def api(built, db):
    return Api(built["tokens"])


@pytest.fixture
def world(built, db):
    return fresh(built["world"])


BIG = 2**63  # one past bigint


def malformed(status: int, body) -> bool:
    return (
        status in (400, 422)
        and isinstance(body, dict)
        and isinstance(body.get("code"), str)
        and isinstance(body.get("message"), str)
    )


@pytest.mark.parametrize(
    "path",
    [
        "/runs/events%2F2026-12-01T03:00%00",  # a run key
        "/runs/a%00b/pause",
        "/policies/ev%00ents",  # a slug
        "/policies/ev%00ents/versions/1",
        "/runs?policy=ev%00ents",  # filters
        "/runs?state=%00",
        "/audit/export.csv?tenant=%00",
        "/audit/export.csv?policy=events&run=%00",
    ],
)
def test_a_nul_character_in_a_run_key_slug_or_filter_is_a_json_error(api, world, path):
    method = "POST" if path.endswith("/pause") else "GET"
    body = {"reason": "INC-1"} if method == "POST" else None
    status, answer = api.call(method, path, body, as_="superuser")
    assert malformed(status, answer), (status, api.body[:300])
    assert answer["code"] == "invalid_request" and "NUL" in answer["message"]


def test_a_nul_character_in_a_body_is_a_json_error_and_changes_nothing(api, world):
    runs = Run.objects.count()
    status, answer = api.post("/runs", {"policy": "ev\x00ents"}, as_="superuser")
    assert (status, answer["code"]) == (422, "invalid_request")
    assert answer["message"] == "policy contains a NUL character"
    assert Run.objects.count() == runs


@pytest.mark.parametrize("field,value", [("key_from", BIG), ("key_to", BIG), ("key_from", -BIG - 1),
                                         ("key_to", 10**40)])  # fmt: skip
def test_a_hold_key_beyond_bigint_is_a_json_error_and_no_hold_is_placed(api, world, field, value):
    holds = LegalHold.objects.count()
    body = {"reason": "LIT-2", "policy": "events", "key_from": 1, "key_to": 2, field: value}
    status, answer = api.post("/holds", body, as_="compliance")
    assert (status, answer["code"]) == (422, "invalid_request"), answer
    assert answer["message"].startswith(f"{field} is out of range")
    assert LegalHold.objects.count() == holds


@pytest.mark.parametrize(
    "period", ["0001-01-01", "0001-01-01T00:00", "1969-12-31", "0001-01-01T00:00+14:00"]
)
def test_a_trigger_for_a_period_before_any_run_is_a_json_error(api, world, period):
    runs = Run.objects.count()
    status, answer = api.post("/runs", {"policy": "events", "period": period}, as_="oncall")
    assert (status, answer["code"]) == (400, "invalid"), answer
    assert "is before 1970" in answer["message"]
    assert Run.objects.count() == runs


# -- every endpoint, fuzzed --------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["\x00", "a\x00", "0001-01-01", "0001-01-01T00:00", "9999-12-31T23:59",
                     "99999-01-01", "-1", "0", str(BIG), str(-BIG - 1), "9" * 40, "1e309",
                     "NaN", "", " ", "%", "..", "'; --", "\u202e", "\ud7ff", "x" * 5000]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
)  # fmt: skip
HOSTILE_INT = st.one_of(
    st.sampled_from([BIG, -BIG - 1, 10**40, -(10**40), 0, -1, 2**31, 2**53 + 1]),
    st.integers(),
)
QUERIES = {
    "/runs": ("policy", "state", "limit"),
    "/audit/export.csv": ("policy", "run", "tenant", "from", "to"),
    "/holds": ("all",),
    "/dead-letters": ("open",),
    "/runs/{key}": ("json",),
    "/policies/{slug}/preview": ("json",),
    "/runs/{key}/check": ("expect_drained",),
}


def _hostile_body(body, draw):
    if isinstance(body, dict):
        key = draw(st.sampled_from(sorted(body))) if body else None
        return {k: (_replace(v, draw) if k == key else v) for k, v in body.items()}
    return body


def _replace(value, draw):
    if isinstance(value, bool):
        return draw(st.one_of(HOSTILE_TEXT, HOSTILE_INT))
    if isinstance(value, int):
        return draw(HOSTILE_INT)
    if isinstance(value, list):
        return [draw(HOSTILE_TEXT)]
    return draw(st.one_of(HOSTILE_TEXT, HOSTILE_INT))


@pytest.mark.parametrize(
    "method,template,path,body,allowed", ENDPOINTS, ids=[f"{m} {t}" for m, t, *_ in ENDPOINTS]
)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_every_endpoint_answers_hostile_input_with_a_json_error_never_a_500(
    api, world, data, method, template, path, body, allowed
):
    draw = data.draw
    params = re.findall(r"\{(\w+)\}", path)
    concrete = (
        path.replace("{run}", world["run"].run_key)
        .replace("{hold}", str(world["hold"].pk))
        .replace("{letter}", "1")
        .replace("{spare}", "1")
    )
    where = draw(st.sampled_from(["path", "query", "body"]), label="where")
    sent = body("superuser") if body else None
    if where == "path" and params:
        # one path parameter replaced by hostile text, percent-encoded as a client sends it
        target = draw(st.sampled_from(params))
        value = quote(str(_replace("", draw)), safe="")
        concrete = path.replace("{" + target + "}", value)
        concrete = (
            concrete.replace("{run}", world["run"].run_key)
            .replace("{hold}", str(world["hold"].pk))
            .replace("{letter}", "1")
            .replace("{spare}", "1")
        )
    elif where == "query" and template in QUERIES:
        name = draw(st.sampled_from(QUERIES[template]))
        concrete += "?" + name + "=" + quote(str(_replace("", draw)), safe="")
    elif where == "body" and isinstance(sent, dict) and sent:
        sent = _hostile_body(sent, draw)
    status, answer = api.call(method, concrete, sent, as_="superuser")
    assert status < 500, (method, concrete, sent, status, api.body[:500])
    if status >= 400:
        assert isinstance(answer, dict) and {"code", "message"} <= set(answer), api.body[:500]
