from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_healthz_reports_the_database_without_login(client):
    from django.core.cache import caches

    # a cluster an earlier test started on this database leaves its last stat in the cache
    # table, which a test's flush does not empty; this test is about a database none reported to
    caches["cluster"].clear()
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] == "ok"
    assert body["status"] == "ok"
    # no cluster has reported into this database: an age would be made up
    assert body["clusters"] == {} and body["worker_heartbeat_age_s"] is None


@pytest.mark.django_db
def test_pages_require_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.django_db
def test_each_role_sees_a_home_page_saying_what_its_role_does(client, make_user):
    from core.roles import ROLE_DESCRIPTIONS

    for n, role in enumerate(("compliance", "oncall", "auditor", "viewer")):
        client.force_login(make_user(f"person{n}", role))  # a username that names no role
        response = client.get("/")
        assert response.status_code == 200
        line = response.content.decode().split('data-testid="signed-in"')[1].split("</p>")[0]
        assert f"<strong>{role}</strong>: {ROLE_DESCRIPTIONS[role]}" in line
        others = [r for r in ROLE_DESCRIPTIONS if r != role]
        assert not any(f"<strong>{r}</strong>" in line for r in others)
        client.logout()


@pytest.mark.django_db
def test_a_user_without_a_role_is_refused(client, django_user_model):
    user = django_user_model.objects.create_user("nobody", password="x")
    client.force_login(user)
    assert client.get("/").status_code == 403
