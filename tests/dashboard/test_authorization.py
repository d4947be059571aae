"""Every URL × every role (and anonymous): the expected status, checked on the server.

The matrix must stay complete: ``test_every_url_has_an_entry_in_the_matrix`` walks the
URL resolver and fails for any named URL pattern without a row here. Every POST is sent
with a valid CSRF token (so the role check is what answers), and again without one.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from core.tokens import create_token
from retention import actions as retention_actions
from retention.models import PolicyVersion
from tests.conftest import create_user, fresh

from .conftest import ROLE_USERS, make_dead_letter

pytestmark = pytest.mark.django_db

ANON = "anonymous"
ROLES = ("viewer", "oncall", "auditor", "compliance")
LOGIN = 302  # anonymous → the login page


def every_role(status: int, *, anonymous: int = LOGIN) -> dict:
    return {ANON: anonymous, **dict.fromkeys(ROLES, status)}


def only(allowed: dict, *, denied: int = 403, anonymous: int = LOGIN) -> dict:
    return {ANON: anonymous, **{r: allowed.get(r, denied) for r in ROLES}}


READ = every_role(200)
EVIDENCE = only({"auditor": 200, "compliance": 200})
ONCALL_POST = only({"oncall": 302})
COMPLIANCE_POST = only({"compliance": 302})

# name: (method, kwargs from the world, expected status per role)
MATRIX = {
    "home": ("GET", {}, READ),
    "healthz": ("GET", {}, every_role(200, anonymous=200)),
    "favicon": ("GET", {}, every_role(301, anonymous=301)),
    "metrics": ("GET", {}, every_role(200, anonymous=401)),
    "login": ("GET", {}, every_role(302, anonymous=200)),
    "logout": ("POST", {}, every_role(302, anonymous=302)),
    "admin": ("GET", {}, every_role(302)),  # the whole admin site: staff only
    # the JSON API answers bearer tokens only, never a session (its own matrix, endpoint by
    # endpoint and role by role: tests/api/test_role_matrix.py)
    "api": ("GET", {}, every_role(401, anonymous=401)),
    "tokens": ("GET", {}, READ),
    "doc": ("GET", {"name": "doc"}, READ),
    # one's own token only: compliance owns the world's token, the others see no such token
    "token_revoke": ("POST", {"token_id": "token"}, only({"compliance": 302}, denied=404)),
    "runs:list": ("GET", {}, READ),
    "runs:detail": ("GET", {"run_id": "run"}, READ),
    "runs:pause": ("POST", {"run_id": "run"}, ONCALL_POST),
    "runs:resume": ("POST", {"run_id": "run"}, ONCALL_POST),
    "runs:cancel": ("POST", {"run_id": "run"}, ONCALL_POST),
    "runs:retry": ("POST", {"run_id": "run"}, ONCALL_POST),
    "runs:confirm": ("POST", {"run_id": "run"}, ONCALL_POST),
    "runs:manifest": ("GET", {"run_id": "run"}, EVIDENCE),
    "runs:period_manifest": ("GET", {"slug": "slug"}, EVIDENCE),
    "runs:dead_letters": ("GET", {}, READ),
    "runs:replay": ("POST", {"letter_id": "letter"}, ONCALL_POST),
    "runs:dead_letters_bulk": ("POST", {}, ONCALL_POST),
    "runs:discard": ("POST", {"letter_id": "letter"}, ONCALL_POST),
    "runs:kill_switch": ("POST", {}, ONCALL_POST),
    "runs:trigger": ("POST", {}, only({"oncall": 404})),  # no policy posted
    "runs:audit": ("GET", {}, EVIDENCE),
    "runs:audit_export": ("GET", {}, EVIDENCE),
    "runs:activity": ("GET", {}, READ),
    "runs:targets": ("GET", {}, READ),
    "runs:target": ("GET", {"name": "target"}, READ),
    "runs:policy_fleet": ("GET", {"slug": "slug"}, READ),
    "retention:policy_list": ("GET", {}, READ),
    "retention:approvals": ("GET", {}, READ),
    "retention:policy_detail": ("GET", {"slug": "slug"}, READ),
    "retention:policy_pause": ("POST", {"slug": "slug"}, ONCALL_POST),
    "retention:policy_resume": ("POST", {"slug": "slug"}, ONCALL_POST),
    "retention:policy_new": ("GET", {}, only({"compliance": 200})),
    "retention:version_create": ("POST", {}, only({"compliance": 400})),  # empty TOML
    "retention:version_detail": ("GET", {"slug": "slug", "number": "number"}, READ),
    # a live full-scan preview: compliance only (tests/security/test_expensive_work.py)
    "retention:version_preview": (
        "GET",
        {"slug": "slug", "number": "number"},
        only({"compliance": 200}),
    ),
    "retention:version_submit": ("POST", {"slug": "slug", "number": "number"}, COMPLIANCE_POST),
    "retention:version_approve": ("POST", {"slug": "slug", "number": "number"}, COMPLIANCE_POST),
    "retention:version_reject": ("POST", {"slug": "slug", "number": "number"}, COMPLIANCE_POST),
    "retention:holds": ("GET", {}, READ),
    "retention:hold_place": ("POST", {}, COMPLIANCE_POST),
    "retention:hold_detail": ("GET", {"hold_id": "hold"}, READ),
    # each serves its confirmation (GET, compliance only) and the step (POST); the matrix
    # posts: the world's hold has no request, so approving, withdrawing and refusing are
    # refused with a message (302 back to the hold), requesting is done
    "retention:hold_release_request": ("POST", {"hold_id": "hold"}, COMPLIANCE_POST),
    "retention:hold_release_approve": ("POST", {"hold_id": "hold"}, COMPLIANCE_POST),
    "retention:hold_release_withdraw": ("POST", {"hold_id": "hold"}, COMPLIANCE_POST),
    "retention:hold_release_refuse": ("POST", {"hold_id": "hold"}, COMPLIANCE_POST),
}
# Namespaces checked as one entry (every pattern inside answers alike), by the URL named.
WHOLE_NAMESPACES = {"admin": "admin:index", "api": "api:me"}


def named_patterns(patterns=None, prefix: str = "") -> list[str]:
    names = []
    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver):
            ns = p.namespace
            if ns in WHOLE_NAMESPACES:
                names.append(ns)
                continue
            names += named_patterns(p.url_patterns, f"{prefix}{ns}:" if ns else prefix)
        elif isinstance(p, URLPattern):
            names.append(f"{prefix}{p.name}" if p.name else f"<unnamed {p.pattern}>")
    return names


def test_every_url_has_an_entry_in_the_matrix():
    names = set(named_patterns())
    missing = sorted(names - set(MATRIX))
    assert not missing, f"add these URLs to the authorization matrix: {missing}"
    stale = sorted(set(MATRIX) - names)
    assert not stale, f"these matrix rows name no URL any more: {stale}"


@pytest.fixture(scope="module")
def built(build_once):
    """A user per role and the world every URL is asked about, once for the module
    (``tests.conftest.build_once``): each test asks in a savepoint rolled back after it."""

    def build():
        users = {role: create_user(name, role) for role, name in ROLE_USERS.items()}
        letter = make_dead_letter(create_user, slug="gone", rows=200)
        hold = retention_actions.place_hold(
            actor=users["compliance"], reason="litigation 42", tenant="3"
        )
        version = PolicyVersion.objects.get(policy__slug="gone")
        token, _ = create_token(users["compliance"], name="laptop")
        world = {
            "token": token.pk,
            "run": letter.run_id,
            "letter": letter.pk,
            "slug": "gone",
            "number": version.number,
            "hold": hold.pk,
            "doc": "runbook",
            "target": "default",
        }
        return {"users": users, "world": world}

    return build_once(build)


@pytest.fixture
def users(built, db):
    return fresh(built["users"])


@pytest.fixture
def world(built, db):
    return built["world"]


def url_of(name: str, world: dict) -> str:
    if name in WHOLE_NAMESPACES:
        return reverse(WHOLE_NAMESPACES[name])
    _, kwargs, _ = MATRIX[name]
    return reverse(name, kwargs={k: world[v] for k, v in kwargs.items()})


def client_as(role: str, users) -> Client:
    client = Client(enforce_csrf_checks=True)
    if role != ANON:
        client.force_login(users[role])
    return client


def csrf_token(client: Client) -> str:
    response = client.get(reverse("login"))
    cookie = response.cookies.get("csrftoken") or client.cookies.get("csrftoken")
    if cookie is None:  # signed in: the login page redirects; take the overview's token
        client.get(reverse("home"))
        cookie = client.cookies.get("csrftoken")
    return cookie.value


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_each_role_gets_the_expected_status(name, world, users):
    method, _, expected = MATRIX[name]
    url = url_of(name, world)
    got = {}
    # Denied roles first: their answers do not depend on what an allowed role changed.
    order = sorted(expected, key=lambda role: expected[role] in (200, 302, 400))
    for role in order:
        client = client_as(role, users)
        if method == "GET":
            response = client.get(url)
        else:
            token = csrf_token(client)
            response = client.post(url, {"csrfmiddlewaretoken": token, "reason": "matrix"})
        got[role] = response.status_code
        if role == ANON and expected[role] == LOGIN:
            login = reverse("admin:login") if name in WHOLE_NAMESPACES else reverse("login")
            assert response["Location"].startswith(login), (name, response["Location"])
    assert got == expected, f"{name} {method} {url}"


@pytest.mark.parametrize("name", sorted(n for n, (m, _, _) in MATRIX.items() if m == "POST"))
def test_every_post_needs_a_csrf_token(name, world, users):
    _, _, expected = MATRIX[name]
    allowed = [r for r in ROLES if expected[r] in (302, 400)] or [ROLES[0]]
    client = client_as(allowed[0], users)

    response = client.post(url_of(name, world), {"reason": "no token"})

    assert response.status_code == 403
    assert b"CSRF" in response.content
