from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_healthz_reports_the_database_without_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] == "ok"
    assert body["status"] == "ok"
    assert "worker_heartbeat_age_s" in body


@pytest.mark.django_db
def test_pages_require_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.django_db
def test_each_role_sees_a_home_page_naming_its_role(client, make_user):
    for role in ("compliance", "oncall", "auditor", "viewer"):
        user = make_user(f"u-{role}", role)
        client.force_login(user)
        response = client.get("/")
        assert response.status_code == 200
        assert role in response.content.decode()
        client.logout()


@pytest.mark.django_db
def test_a_user_without_a_role_is_refused(client, django_user_model):
    user = django_user_model.objects.create_user("nobody", password="x")
    client.force_login(user)
    assert client.get("/").status_code == 403
