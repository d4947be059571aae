"""Sign-in throttling (django-axes, configured in core.signin): per username and client
address, a per-username ceiling over all addresses, the proxy's forwarded address when
the peer is a trusted proxy, failures kept as evidence, no overshoot under concurrency."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import F
from django.test import Client

LOGIN = "/login/"
HOME = "10.0.0.1"
PROXY = "10.9.0.2"


@pytest.fixture
def alice(make_user):
    return make_user("alice", "viewer")  # password "alice-pw"


def attempt(client, username, password, address=HOME, url=LOGIN, forwarded=None):
    extra = {"REMOTE_ADDR": address}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return client.post(url, {"username": username, "password": password}, **extra)


def test_five_failures_lock_the_username_from_that_address_even_for_the_right_password(
    client, alice
):
    for _ in range(4):
        assert attempt(client, "alice", "wrong").status_code == 200
    assert attempt(client, "alice", "wrong").status_code == 429  # the fifth locks
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
    for name in ("alice", "ALICE", "Alice", "aLiCe", " alicE"):
        attempt(client, name, "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 429


def test_a_successful_sign_in_clears_the_count_but_keeps_the_evidence(client, alice):
    for _ in range(4):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 302
    client.logout()
    for _ in range(4):
        assert attempt(client, "alice", "wrong").status_code == 200
    assert attempt(client, "alice", "alice-pw").status_code == 302
    evidence = AccessFailureLog.objects.filter(username="alice")
    assert evidence.count() == 8
    assert set(evidence.values_list("ip_address", flat=True)) == {HOME}
    assert not any("alice-pw" in str(row) or "wrong" in str(row) for row in evidence.values())


def test_the_lock_ends_when_the_window_has_passed(client, alice, settings):
    for _ in range(5):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 429
    window = timedelta(seconds=settings.LOGIN_FAILURE_WINDOW_S + 1)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - window)
    assert attempt(client, "alice", "alice-pw").status_code == 302


def test_the_admin_sign_in_obeys_the_same_lock(client, make_user):
    admin = make_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    for _ in range(5):
        attempt(client, "root", "wrong", url="/admin/login/")
    assert attempt(client, "root", "root-pw", url="/admin/login/").status_code == 429
    assert "_auth_user_id" not in client.session
    assert (
        attempt(client, "root", "root-pw", address="10.9.9.9", url="/admin/login/").status_code
        == 302
    )


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted_not_the_proxy(
    client, alice, settings
):
    """Without this, everyone behind the proxy shares one address: one guesser locks
    every user out (e.g. every on-call engineer during an incident)."""
    settings.TRUSTED_PROXIES = ["10.9.0.0/24"]
    for _ in range(5):
        attempt(client, "alice", "wrong", address=PROXY, forwarded="203.0.113.7")
    assert (
        attempt(client, "alice", "alice-pw", address=PROXY, forwarded="203.0.113.7").status_code
        == 429
    )
    ok = attempt(client, "alice", "alice-pw", address=PROXY, forwarded="198.51.100.4")
    assert ok.status_code == 302
    assert set(AccessFailureLog.objects.values_list("ip_address", flat=True)) == {"203.0.113.7"}


def test_a_forwarded_header_from_an_untrusted_peer_is_ignored(client, alice, settings):
    settings.TRUSTED_PROXIES = ["10.9.0.0/24"]
    for n in range(5):  # a guesser inventing a new X-Forwarded-For every time
        attempt(client, "alice", "wrong", address="192.0.2.50", forwarded=f"198.51.100.{n}")
    assert attempt(client, "alice", "alice-pw", address="192.0.2.50").status_code == 429
    # and a client's own claim left of the proxy's entry does not choose its address
    for n in range(5):
        attempt(client, "alice", "wrong", address=PROXY, forwarded=f"198.51.100.{n}, 203.0.113.9")
    assert (
        attempt(client, "alice", "alice-pw", address=PROXY, forwarded="203.0.113.9").status_code
        == 429
    )


def test_guessing_one_username_from_many_addresses_hits_a_ceiling(client, alice, settings):
    settings.LOGIN_USERNAME_CEILING = 12
    for n in range(12):  # 3 per address: none of them reaches the per-address limit
        attempt(client, "alice", "wrong", address=f"10.1.{n // 3}.1")
    assert attempt(client, "alice", "alice-pw", address="10.200.0.1").status_code == 429
    evidence = AccessFailureLog.objects.filter(username="alice").order_by("attempt_time")
    assert evidence.count() == 13  # the twelve guesses, and the refused attempt
    last = evidence.last()
    assert (last.ip_address, last.locked_out) == ("10.200.0.1", True)


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_attempts_check_no_more_passwords_than_the_limit(monkeypatch):
    User.objects.create_user("alice", password="alice-pw")
    checked = []
    original = User.check_password

    def counting(self, raw):
        checked.append(raw)
        return original(self, raw)

    monkeypatch.setattr(User, "check_password", counting)
    start = threading.Barrier(12)
    statuses = []

    def guess():
        start.wait()
        try:
            statuses.append(attempt(Client(), "alice", "wrong").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=guess) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(statuses) == [200] * 4 + [429] * 8
    assert len(checked) == 5  # limit 5: twelve parallel guesses test five passwords
    assert attempt(Client(), "alice", "alice-pw").status_code == 429


@pytest.mark.parametrize(
    "password", ["short-pw1", "password1234", "123456789012345", "alice-the-user-2026"]
)
def test_weak_passwords_are_refused_by_the_validators(db, password):
    with pytest.raises(ValidationError):
        validate_password(password, User(username="alice-the-user-2026"))


def test_a_long_uncommon_password_passes_the_validators(db):
    validate_password("plum-ladder-orbit-41", User(username="alice"))


def test_the_sign_in_evidence_is_read_only_in_the_admin(client, alice):
    attempt(client, "alice", "wrong")
    row = AccessFailureLog.objects.get()
    client.force_login(User.objects.create_superuser("root", password="root-pw-long"))
    assert client.get(f"/admin/axes/accessfailurelog/{row.pk}/change/").status_code == 200
    assert (
        client.post(f"/admin/axes/accessfailurelog/{row.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert AccessFailureLog.objects.filter(pk=row.pk).exists()


@pytest.fixture
def delays(monkeypatch):
    """The sign-in delays asked for (recorded, not slept: tests never time anything)."""
    asked: list[float] = []
    monkeypatch.setattr("core.signin.pause", asked.append)
    return asked


def test_guesses_from_many_forwarded_addresses_do_not_lock_her_out_of_her_known_address(
    client, alice, settings, delays
):
    settings.TRUSTED_PROXIES = ["10.9.0.0/24"]
    settings.LOGIN_USERNAME_CEILING = 12
    home = "203.0.113.7"
    assert attempt(client, "alice", "alice-pw", address=PROXY, forwarded=home).status_code == 302
    client.logout()
    for n in range(12):  # 3 per address: none reaches the per-address limit
        attempt(client, "alice", "wrong", address=PROXY, forwarded=f"198.51.100.{n // 3}")

    # from an address she never signed in from, the ceiling refuses even the right password
    stranger = attempt(client, "alice", "alice-pw", address=PROXY, forwarded="192.0.2.99")
    assert stranger.status_code == 429
    assert delays == []
    # from her own address she gets in, after a delay
    assert attempt(client, "alice", "alice-pw", address=PROXY, forwarded=home).status_code == 302
    assert "_auth_user_id" in client.session
    assert len(delays) == 1 and delays[0] > 0


def test_the_delay_at_a_known_address_grows_with_the_guesses_over_the_ceiling(
    client, alice, settings, delays
):
    settings.LOGIN_USERNAME_CEILING = 10
    assert attempt(client, "alice", "alice-pw").status_code == 302
    client.logout()
    for n in range(10):
        attempt(client, "alice", "wrong", address=f"10.1.{n // 3}.1")
    assert attempt(client, "alice", "wrong").status_code == 200  # known address: slowed
    for n in range(20):
        attempt(client, "alice", "wrong", address=f"10.2.{n // 3}.1")
    assert attempt(client, "alice", "wrong").status_code == 200
    assert len(delays) == 2 and 0 < delays[0] < delays[1]
    assert attempt(client, "alice", "alice-pw").status_code == 302


@pytest.mark.parametrize("variant", ["ａｌｉｃｅ", "ＡＬＩＣＥ", "Ａlice", " ALICE"])
def test_full_width_and_case_variants_of_a_username_share_its_count(client, alice, variant):
    for _ in range(5):
        attempt(client, variant, "wrong")
    assert attempt(client, "alice", "alice-pw").status_code == 429


def test_usernames_are_compared_casefolded(client, make_user):
    make_user("maße", "viewer")  # casefolds to "masse", as "MASSE" does (lower() would not)
    for _ in range(5):
        attempt(client, "MASSE", "wrong")
    assert attempt(client, "maße", "maße-pw").status_code == 429


def test_the_command_line_counts_a_full_width_variant_as_the_username(alice, monkeypatch):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    for _ in range(5):
        monkeypatch.setattr("sys.stdin", io.StringIO("wrong\n"))
        with pytest.raises(CommandError):
            call_command("retention", "token", "create", "--username", "ＡＬＩＣＥ",
                         "--password-stdin", stdout=io.StringIO(), stderr=io.StringIO())  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO("alice-pw\n"))
    with pytest.raises(CommandError, match="too many failed sign-ins"):
        call_command("retention", "token", "create", "--username", "alice", "--password-stdin",
                     stdout=io.StringIO(), stderr=io.StringIO())  # fmt: skip


def test_the_ipv6_addresses_of_one_64_share_a_count(client, alice):
    for n in range(5):
        attempt(client, "alice", "wrong", address=f"2001:db8:1:2:{n}::{n + 1}")
    assert attempt(client, "alice", "alice-pw", address="2001:db8:1:2::ffff").status_code == 429
    assert attempt(client, "alice", "alice-pw", address="2001:db8:1:3::1").status_code == 302
