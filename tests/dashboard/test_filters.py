"""Every filter of every page: hostile or out-of-range input gets one clear error (400),
never a 500, and changes nothing. Fuzzed with hypothesis."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.models import OperatorAction
from runs.models import AuditRecord
from tests.conftest import create_user, fresh
from tests.dashboard.conftest import make_dead_letter, run_with_three_chunks
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import create_events

# page → its filters (query parameters)
FILTERS = {
    "/": ("policy",),
    "/runs/": ("policy", "state"),
    "/runs/dead-letters/": ("show", "run", "policy"),
    "/runs/audit/": ("policy", "run", "tenant", "from", "to"),
    "/runs/audit/export.csv": ("policy", "run", "tenant", "from", "to"),
    "/runs/activity/": ("actor", "action"),
}
CASES = [(page, name) for page, names in FILTERS.items() for name in names]

HOSTILE = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=300),
    st.sampled_from(
        ["²", "١٢", "99999999999999999999999", "-1", "9999-12-31", "0001-01-01", "2026-02-30",
         "\x00", "a\x00b", "x" * 5000, "' OR 1=1 --", "%", "\u200b", " 12 "]
    ),
)  # fmt: skip


@pytest.fixture(scope="module")
def built(build_once):
    """What every filter is asked about, once for the module (``tests.conftest.build_once``):
    a run with three chunks committed (audit rows to filter), a dead letter and a superuser.
    Each test, and each of its hypothesis examples, asks in a savepoint rolled back after the
    test."""

    def build():
        create_events(3000)
        run_with_three_chunks(approved_policy(create_user, **events_spec()))
        make_dead_letter(create_user)
        return User.objects.create_superuser("root", password="pw")

    return build_once(build)


@pytest.fixture
def admin_client(built, db) -> Client:
    client = Client()
    client.force_login(fresh(built))
    return client


def check(client: Client, page: str, params: dict, *, htmx: bool = False) -> None:
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = client.get(page, params, **extra)
    assert response.status_code in (200, 400), (page, params, response.status_code)
    if response.status_code == 400:
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert b"error" in body.lower() or b"must" in body.lower(), body[:300]


@pytest.mark.parametrize(
    ("page", "params"),
    [
        ("/runs/audit/", {"run": "²"}),
        ("/runs/audit/export.csv", {"run": "²"}),
        ("/runs/dead-letters/", {"run": "²"}),
        ("/runs/audit/", {"to": "9999-12-31"}),
        ("/runs/audit/", {"run": "99999999999999999999999"}),
        ("/runs/activity/", {"actor": "a\x00b"}),
        ("/runs/", {"state": "a\x00b"}),
    ],
)
def test_the_reported_inputs_get_one_clear_error(admin_client, page, params):
    response = admin_client.get(page, params)
    assert response.status_code == 400
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert list(params)[0].encode() in body  # the error names the filter


def test_a_bad_audit_filter_shows_no_records_rather_than_ignoring_the_filter(admin_client):
    assert AuditRecord.objects.exists()
    page = admin_client.get("/runs/audit/", {"to": "9999-12-31", "policy": "events"})
    assert page.status_code == 400
    assert not page.context["records"]


@pytest.mark.parametrize(("page", "name"), CASES)
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=HOSTILE)
def test_every_filter_of_every_page_answers_200_or_one_clear_error(admin_client, page, name, value):
    before = OperatorAction.objects.count()
    check(admin_client, page, {name: value})
    if page == "/":
        check(admin_client, page, {name: value}, htmx=True)
    assert OperatorAction.objects.count() == before
