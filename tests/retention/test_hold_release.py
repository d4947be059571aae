"""Releasing a legal hold needs two compliance officers: one requests the release (the hold
stays in force), another approves it. The requester may withdraw a pending request, another
officer may refuse it; the requester is refused approving, on the CLI and the pages, with
one message. Each step is on the hold's page, in the operator log and in the evidence, and
the request and the approval confirm what they will do: how many rows become eligible at
each affected policy's next run, and when that run is."""

from __future__ import annotations

import io
import json
from datetime import datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.urls import reverse
from django.utils import timezone

from core.models import OperatorAction
from retention import actions, holds
from retention.actions import ActionError
from retention.models import LegalHold, Policy
from retention.preview import preview
from retention.schedule_math import next_tick
from retention.spec import load_toml
from tests.runs import conftest as run_fixtures

from .conftest import count_rows, policy_toml

events, events_policy = run_fixtures.events, run_fixtures.events_policy  # the fixtures


@pytest.fixture
def carol(make_user):
    return make_user("carol", "compliance")


@pytest.fixture
def policy(events_table, alice, bob) -> Policy:
    """``events`` on public.t_events, approved: rows older than 30 days, daily at 03:00."""
    version = actions.apply_spec(load_toml(policy_toml()), author=alice)
    version = actions.submit_version(version, actor=alice, reason="ready for review")
    actions.approve_version(version, actor=bob, reason="reviewed")
    return Policy.objects.get(slug="events")


@pytest.fixture
def hold(policy, alice) -> LegalHold:
    return actions.place_hold(actor=alice, reason="subpoena 7", policy=policy, tenant="3")


def eligible_now(policy) -> int:
    return preview(policy.approved_version.parsed, policy_id=policy.pk)["eligible"]


def log(hold) -> list[tuple[str, str, str]]:
    rows = OperatorAction.objects.filter(target_type="legalhold", target_id=str(hold.pk))
    return list(rows.order_by("chain_seq").values_list("action", "actor", "reason"))


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("retention", "hold", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_a_release_request_leaves_the_hold_in_force(hold, policy, alice):
    before = eligible_now(policy)

    actions.request_hold_release(hold, actor=alice, reason="case settled")

    hold.refresh_from_db()
    assert hold.active and hold.release_pending
    assert (hold.release_requested_by, hold.release_request_reason) == ("alice", "case settled")
    assert eligible_now(policy) == before  # the DELETE still sees the hold
    assert log(hold)[-1] == ("hold.release_request", "alice", "case settled")


def test_the_requester_cannot_approve_her_own_request(hold, alice):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    entries = len(log(hold))

    with pytest.raises(ActionError) as refused:
        actions.approve_hold_release(hold, actor=alice, reason="mine")

    assert str(refused.value) == (
        f"alice requested the release of hold #{hold.pk} and cannot approve it; "
        "another member of compliance must"
    )
    hold.refresh_from_db()
    assert hold.active and hold.release_pending and len(log(hold)) == entries


def test_another_officer_approves_and_the_held_rows_become_eligible(hold, policy, alice, bob):
    before = eligible_now(policy)
    actions.request_hold_release(hold, actor=alice, reason="case settled")

    actions.approve_hold_release(hold, actor=bob, reason="confirmed with counsel")

    hold.refresh_from_db()
    assert not hold.active and not hold.release_pending
    assert (hold.release_requested_by, hold.released_by) == ("alice", "bob")
    assert hold.release_reason == "confirmed with counsel"
    assert eligible_now(policy) > before
    action, actor, reason = log(hold)[-1]
    assert (action, actor, reason) == ("hold.release", "bob", "confirmed with counsel")
    details = OperatorAction.objects.filter(action="hold.release").get().details
    assert (details["requested_by"], details["request_reason"]) == ("alice", "case settled")


def test_approving_needs_a_pending_request(hold, bob):
    with pytest.raises(ActionError, match=f"hold #{hold.pk} has no release request"):
        actions.approve_hold_release(hold, actor=bob, reason="x")
    hold.refresh_from_db()
    assert hold.active


def test_only_the_requester_withdraws_and_only_another_officer_refuses(hold, alice, bob, carol):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    with pytest.raises(ActionError, match="only alice, who requested it, can withdraw"):
        actions.withdraw_hold_release(hold, actor=bob, reason="not yours")
    with pytest.raises(ActionError, match="alice requested the release .* cannot refuse it"):
        actions.refuse_hold_release(hold, actor=alice, reason="changed my mind")

    actions.withdraw_hold_release(hold, actor=alice, reason="new evidence")
    hold.refresh_from_db()
    assert hold.active and not hold.release_pending

    actions.request_hold_release(hold, actor=bob, reason="settled again")
    actions.refuse_hold_release(hold, actor=carol, reason="appeal pending")
    hold.refresh_from_db()
    assert hold.active and not hold.release_pending
    assert [a for a, _, _ in log(hold)] == [
        "hold.place",
        "hold.release_request",
        "hold.release_withdraw",
        "hold.release_request",
        "hold.release_refuse",
    ]


def test_a_decision_made_on_a_stale_page_is_refused(hold, alice, bob, carol):
    shown = hold.decision_token  # the page a second officer loaded: no request yet
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    with pytest.raises(ActionError, match="changed since the page was loaded"):
        actions.request_hold_release(hold, actor=bob, reason="settled", expected=shown)

    shown = LegalHold.objects.get(pk=hold.pk).decision_token  # alice's request, pending
    actions.withdraw_hold_release(hold, actor=alice, reason="new evidence")
    actions.request_hold_release(hold, actor=carol, reason="other reason")
    with pytest.raises(ActionError, match="changed since the page was loaded"):
        actions.approve_hold_release(hold, actor=bob, reason="ok", expected=shown)
    hold.refresh_from_db()
    assert hold.active and hold.release_requested_by == "carol"


def test_the_database_refuses_a_release_by_its_own_requester(hold, alice):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "UPDATE retention_legalhold SET released_by = release_requested_by,"
            " released_at = now() WHERE id = %s",
            [hold.pk],
        )
    hold.refresh_from_db()
    assert hold.active


def test_the_release_says_how_many_rows_become_eligible_at_each_next_run(hold, policy):
    now = timezone.now()
    tick = next_tick(policy, now)
    cutoff = policy.approved_version.parsed.cutoff_for(tick)

    (impact,) = holds.release_impact(hold, now=now)

    assert (impact.policy, impact.next_run) == ("events", tick)
    assert impact.rows == count_rows("tenant_id = 3 AND occurred_at < %s", [cutoff]) > 0
    assert impact.describe().startswith(f"events: {impact.rows:,} rows become eligible")


def test_rows_another_active_hold_keeps_do_not_count(hold, policy, bob):
    actions.place_hold(actor=bob, reason="audit", policy=policy, tenant="3", key_to=1000)
    now = timezone.now()
    cutoff = policy.approved_version.parsed.cutoff_for(next_tick(policy, now))

    (impact,) = holds.release_impact(hold, now=now)

    assert impact.rows == count_rows("tenant_id = 3 AND id >= 1000 AND occurred_at < %s", [cutoff])


def test_the_hold_commands_request_approve_withdraw_and_refuse(hold, alice, bob, act_as):
    act_as(alice)
    requested = cli("release", str(hold.pk), "--reason", "case settled")
    assert requested.startswith(f"hold #{hold.pk}: release requested by alice; it stays in force")
    assert "rows become eligible" in requested
    with pytest.raises(CommandError, match="alice requested the release .* cannot approve it"):
        cli("approve-release", str(hold.pk), "--reason", "mine")
    assert LegalHold.objects.get(pk=hold.pk).active

    act_as(bob)
    with pytest.raises(CommandError, match="only alice, who requested it, can withdraw"):
        cli("withdraw-release", str(hold.pk), "--reason", "x")
    approved = cli("approve-release", str(hold.pk), "--reason", "confirmed")
    assert approved.startswith(f"hold #{hold.pk} released by bob (requested by alice)")
    assert not LegalHold.objects.get(pk=hold.pk).active
    assert f"#{hold.pk}" in cli("list", "--all") and "released" in cli("list", "--all")


def test_the_hold_list_shows_a_pending_request(hold, alice, act_as):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    act_as(alice)
    listed = cli("list")
    assert "release requested by alice" in listed and "case settled" in listed


def test_the_hold_page_shows_the_request_and_the_approval(hold, alice, bob, client, make_user):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    actions.approve_hold_release(hold, actor=bob, reason="confirmed with counsel")
    client.force_login(make_user("vera", "viewer"))

    page = client.get(reverse("retention:hold_detail", args=[hold.pk])).content.decode()

    for text in ("subpoena 7", "case settled", "confirmed with counsel", "alice", "bob"):
        assert text in page
    assert 'data-testid="release-requested"' in page and 'data-testid="released"' in page


def test_on_the_pages_the_requester_cannot_approve_and_another_officer_can(
    hold, alice, bob, client
):
    client.force_login(alice)
    confirm = client.get(reverse("retention:hold_release_request", args=[hold.pk]))
    html = confirm.content.decode()
    assert confirm.status_code == 200 and "rows become eligible" in html and "next run" in html
    token = confirm.context["hold"].decision_token
    client.post(
        reverse("retention:hold_release_request", args=[hold.pk]),
        {"reason": "case settled", "expected": token},
    )
    hold.refresh_from_db()
    assert hold.release_pending and hold.active

    page = client.get(reverse("retention:hold_detail", args=[hold.pk])).content.decode()
    assert "another member of compliance must approve" in page
    assert reverse("retention:hold_release_approve", args=[hold.pk]) not in page
    refused = client.post(
        reverse("retention:hold_release_approve", args=[hold.pk]),
        {"reason": "mine", "expected": hold.decision_token},
        follow=True,
    )
    assert "cannot approve it; another member of compliance must" in refused.content.decode()
    hold.refresh_from_db()
    assert hold.active

    client.force_login(bob)
    confirm = client.get(reverse("retention:hold_release_approve", args=[hold.pk]))
    assert "rows become eligible" in confirm.content.decode()
    client.post(
        reverse("retention:hold_release_approve", args=[hold.pk]),
        {"reason": "confirmed", "expected": hold.decision_token, "password": "bob-pw"},
    )
    hold.refresh_from_db()
    assert not hold.active and hold.released_by == "bob"


def test_approving_a_release_asks_for_the_password_again_as_approving_a_version_does(
    hold, alice, bob, client
):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    hold.refresh_from_db()
    client.force_login(bob)  # a session alone, as a taken cookie would give
    url = reverse("retention:hold_release_approve", args=[hold.pk])
    assert 'data-testid="reauth-password"' in client.get(url).content.decode()

    for form, refusal in (
        ({}, f"enter your password to confirm the release of hold #{hold.pk}"),
        ({"password": "guess"}, f"wrong password: the release of hold #{hold.pk} was not done"),
    ):
        page = client.post(
            url, {"reason": "ok", "expected": hold.decision_token, **form}, follow=True
        )
        assert refusal in page.content.decode()
        hold.refresh_from_db()
        assert hold.active and hold.release_pending
    assert ("hold.release", "bob") not in {(a, who) for a, who, _ in log(hold)}

    client.post(url, {"reason": "ok", "expected": hold.decision_token, "password": "bob-pw"})
    hold.refresh_from_db()
    assert not hold.active and hold.released_by == "bob"
    # within the window the password is not asked again, for a release or an approval
    other = actions.place_hold(actor=alice, reason="subpoena 8", policy=hold.policy, tenant="4")
    actions.request_hold_release(other, actor=alice, reason="settled too")
    page = client.get(reverse("retention:hold_release_approve", args=[other.pk]))
    assert 'data-testid="reauth-password"' not in page.content.decode()


def test_a_requested_release_waits_in_the_approvals_queue_for_another_officer(
    hold, alice, bob, client
):
    actions.request_hold_release(hold, actor=alice, reason="case settled")
    approvals = reverse("retention:approvals")

    client.force_login(bob)
    page = client.get(approvals).content.decode()
    card = page.split(f'data-release="{hold.pk}"', 1)[1].split("</section>", 1)[0]
    assert "Hold releases awaiting my decision" in page
    assert "alice" in card and "case settled" in card and "subpoena 7" in card
    assert "rows become eligible" in card  # what the release will do, as on its own page
    assert reverse("retention:hold_release_approve", args=[hold.pk]) in card
    assert reverse("retention:hold_release_refuse", args=[hold.pk]) in card

    client.force_login(alice)
    page = client.get(approvals).content.decode()
    card = page.split(f'data-release="{hold.pk}"', 1)[1].split("</section>", 1)[0]
    assert "Hold releases I requested, awaiting someone else" in page
    assert reverse("retention:hold_release_approve", args=[hold.pk]) not in card

    actions.approve_hold_release(hold, actor=bob, reason="confirmed with counsel")
    client.force_login(bob)
    assert f'data-release="{hold.pk}"' not in client.get(approvals).content.decode()


def test_the_hold_list_requests_a_release_in_one_click(hold, alice, client):
    client.force_login(alice)
    page = client.get(reverse("retention:holds")).content.decode()
    row = page.split(f'data-hold="{hold.pk}"', 1)[1].split("</tr>", 1)[0]
    link = reverse("retention:hold_release_request", args=[hold.pk])
    assert f'href="{link}"' in row
    confirm = client.get(link).content.decode()
    assert "rows become eligible" in confirm and 'name="reason"' in confirm


def test_the_manifest_names_who_requested_and_who_approved_a_release(
    events, events_policy, make_user
):
    from runs.actions import trigger_run
    from runs.engine import worker
    from runs.evidence import exports
    from tests.runs.conftest import NOW

    keeper = make_user("kim", "compliance")
    second = make_user("kurt", "compliance")
    held = actions.place_hold(actor=keeper, reason="litigation", policy=events_policy, tenant="3")
    run, _ = trigger_run(events_policy, tick=NOW)
    actions.request_hold_release(held, actor=keeper, reason="settled")
    actions.approve_hold_release(held, actor=second, reason="confirmed")
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()

    manifest = json.loads("".join(exports.manifest_json(run)))

    (entry,) = [h for h in manifest["holds"] if h["id"] == held.pk]
    assert (entry["release_requested_by"], entry["released_by"]) == ("kim", "kurt")
    assert (entry["release_request_reason"], entry["release_reason"]) == ("settled", "confirmed")
    assert datetime.fromisoformat(entry["release_requested_at"]) <= datetime.fromisoformat(
        entry["released_at"]
    )
