"""Failed sign-ins are throttled per username and client address (core.throttle)."""

from __future__ import annotations

import time

import pytest

LOGIN = "/login/"
HOME = "10.0.0.1"


@pytest.fixture
def alice(make_user):
    return make_user("alice", "viewer")  # password "alice-pw"


def attempt(client, username, password, address=HOME, url=LOGIN):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_five_failures_lock_the_username_from_that_address_even_for_the_right_password(
    client, alice
):
    for _ in range(5):
        assert attempt(client, "alice", "wrong").status_code == 200
    locked = attempt(client, "alice", "alice-pw")
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_lock_is_per_address_and_per_username(client, alice, make_user):
    make_user("bob", "viewer")
    for _ in range(5):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", "alice-pw", address="10.0.0.2").status_code == 302
    client.logout()
    assert attempt(client, "bob", "bob-pw").status_code == 302


def test_usernames_differing_only_in_case_share_the_count(client, alice):
    for name in ("alice", "ALICE", "Alice", "aLiCe", "alicE"):
        attempt(client, name, "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 429


def test_a_successful_sign_in_clears_the_failures(client, alice):
    for _ in range(4):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 302
    client.logout()
    for _ in range(4):
        assert attempt(client, "alice", "wrong").status_code == 200
    assert attempt(client, "alice", "alice-pw").status_code == 302


def test_the_lock_ends_when_the_failures_leave_the_window(client, alice, settings, monkeypatch):
    from core import throttle

    settings.LOGIN_FAILURE_WINDOW_S = 60
    for _ in range(5):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 429
    later = time.time() + 61
    monkeypatch.setattr(throttle.time, "time", lambda: later)
    assert attempt(client, "alice", "alice-pw").status_code == 302


def test_the_admin_sign_in_obeys_the_same_lock(client, make_user):
    admin = make_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    for _ in range(5):
        attempt(client, "root", "wrong", url="/admin/login/")
    response = attempt(client, "root", "root-pw", url="/admin/login/")
    assert response.status_code == 200  # the admin's own form error, not a sign-in
    assert "_auth_user_id" not in client.session
    assert (
        attempt(client, "root", "root-pw", address="10.9.9.9", url="/admin/login/").status_code
        == 302
    )
