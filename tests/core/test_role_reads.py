"""A request signed in by session or by token reads its person's role groups once: the seal
check that lets the person in and the roles that decide what they may do share that reading."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from core.tokens import create_token

pytestmark = pytest.mark.django_db


def group_reads(queries) -> int:
    return sum('FROM "auth_group"' in q["sql"] for q in queries)


def test_a_signed_in_page_reads_the_persons_groups_once(make_user):
    client = Client()
    client.force_login(make_user("vera", "viewer"))
    with CaptureQueriesContext(connection) as seen:
        response = client.get(reverse("runs:list"))
    assert response.status_code == 200
    assert group_reads(seen.captured_queries) == 1


def test_a_token_request_reads_the_owners_groups_once(make_user):
    _, secret = create_token(make_user("audrey", "auditor"), name="reads")
    with CaptureQueriesContext(connection) as seen:
        response = Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    assert response.json()["roles"] == ["auditor"]
    assert group_reads(seen.captured_queries) == 1


def test_a_role_group_joined_behind_the_products_back_still_breaks_the_seal(make_user):
    from django.contrib.auth.models import Group

    user = make_user("olga", "viewer")
    client = Client()
    client.force_login(user)
    oncall, _ = Group.objects.get_or_create(name="oncall")
    with connection.cursor() as cur:  # the database login alone: no reseal
        cur.execute(
            "INSERT INTO auth_user_groups (user_id, group_id) VALUES (%s, %s)", [user.pk, oncall.pk]
        )
    response = client.get(reverse("runs:list"))
    assert response.status_code == 302 and "/login/" in response["Location"]
