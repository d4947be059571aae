from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from core.models import OperatorAction
from retention import actions
from retention.actions import ActionError
from retention.models import LegalHold, Policy, PolicyVersion
from retention.spec import load_toml

from .conftest import policy_toml


def submitted(author, **overrides) -> PolicyVersion:
    version = actions.apply_spec(load_toml(policy_toml(**overrides)), author=author)
    return actions.submit_version(version, actor=author, reason="ready for review")


def version_url(name: str, version: PolicyVersion) -> str:
    return reverse(f"retention:{name}", args=[version.policy.slug, version.number])


@pytest.fixture
def as_user(client):
    def login(user):
        client.force_login(user)
        return client

    return login


def test_the_policy_list_shows_each_policy_and_its_versions_state(
    events_table, alice, vera, as_user
):
    submitted(alice)
    page = as_user(vera).get(reverse("retention:policy_list"))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-policy="events"' in html
    assert "not approved" in html and "submitted" in html
    assert "<html" in html


def test_the_policy_list_refreshes_only_its_rows_over_htmx(events_table, alice, vera, as_user):
    submitted(alice)
    page = as_user(vera).get(reverse("retention:policy_list"), HTTP_HX_REQUEST="true")
    html = page.content.decode()
    assert 'data-policy="events"' in html
    assert "<html" not in html and "<table" not in html


def test_the_version_page_shows_the_diff_against_the_approved_version_warnings_and_preview(
    events_table, alice, bob, vera, as_user
):
    actions.approve_version(submitted(alice), actor=bob, reason="ok")
    second = submitted(alice, retention='"60 days"', tenant=None)

    page = as_user(vera).get(version_url("version_detail", second))
    html = page.content.decode()

    assert page.status_code == 200
    assert "against the approved v1" in html
    assert "(2 fields changed)" in html
    assert '<tr class="changed" data-field="retention">' in html
    assert "<code>30 days</code>" in html and "<code>60 days</code>" in html
    assert "no btree index" not in html  # the primary key supports the plan
    assert f'data-eligible="{second.preview["eligible"]}"' in html
    assert 'class="bar"' in html


def test_the_approver_sees_the_forms_but_the_author_does_not(events_table, alice, bob, as_user):
    version = submitted(alice)
    html = as_user(alice).get(version_url("version_detail", version)).content.decode()
    assert "another member of compliance must approve" in html
    assert version_url("version_approve", version) not in html

    html = as_user(bob).get(version_url("version_detail", version)).content.decode()
    assert version_url("version_approve", version) in html
    assert version_url("version_reject", version) in html


def test_whoever_submitted_sees_no_decision_forms_and_is_named_on_the_page(
    events_table, alice, bob, as_user
):
    draft = actions.apply_spec(load_toml(policy_toml()), author=alice)
    version = actions.submit_version(draft, actor=bob, reason="ready for review")
    html = as_user(bob).get(version_url("version_detail", version)).content.decode()
    assert "You submitted this version; another member of compliance must approve" in html
    assert "submitted by bob" in html
    assert version_url("version_approve", version) not in html


def test_the_author_cannot_approve_by_posting_the_form_directly(events_table, alice, as_user):
    version = submitted(alice)

    page = as_user(alice).post(
        version_url("version_approve", version),
        {"reason": "looks good", "password": "alice-pw"},
        follow=True,
    )

    assert "alice wrote events v1 and cannot approve it" in page.content.decode()
    version.refresh_from_db()
    assert version.state == "submitted"


def test_another_officer_approves_with_a_reason(events_table, alice, bob, as_user):
    version = submitted(alice)
    client = as_user(bob)

    client.post(version_url("version_approve", version), {"reason": "", "password": "bob-pw"})
    version.refresh_from_db()
    assert version.state == "submitted"

    page = client.post(
        version_url("version_approve", version), {"reason": "checked", "password": "bob-pw"}
    )
    assert page.status_code == 302
    version.refresh_from_db()
    assert (version.state, version.decided_by, version.decision_reason) == (
        "approved",
        bob,
        "checked",
    )


def test_a_viewer_cannot_decide_or_place_holds(events_table, alice, vera, as_user):
    version = submitted(alice)
    client = as_user(vera)

    assert client.post(version_url("version_approve", version), {"reason": "x"}).status_code == 403
    assert client.post(version_url("version_reject", version), {"reason": "x"}).status_code == 403
    assert client.post(reverse("retention:hold_place"), {"reason": "x"}).status_code == 403
    assert client.get(version_url("version_approve", version)).status_code == 405
    version.refresh_from_db()
    assert version.state == "submitted"
    assert LegalHold.objects.count() == 0


def test_decision_forms_need_the_csrf_token(events_table, alice, bob):
    version = submitted(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)

    page = client.post(version_url("version_approve", version), {"reason": "x"})

    assert page.status_code == 403
    version.refresh_from_db()
    assert version.state == "submitted"


def test_pasting_toml_creates_a_draft_and_submitting_it_takes_the_preview(
    events_table, alice, as_user
):
    client = as_user(alice)
    page = client.post(reverse("retention:version_create"), {"toml": policy_toml()})
    version = PolicyVersion.objects.get()
    assert page.status_code == 302
    assert page["Location"] == version_url("version_detail", version)
    assert version.state == "draft"

    client.post(version_url("version_submit", version), {"reason": "first cut"})

    version.refresh_from_db()
    assert version.state == "submitted"
    assert version.preview["eligible"] > 0
    assert OperatorAction.objects.get(action="version.submit").reason == "first cut"


def test_submitting_on_the_page_without_a_reason_gets_the_actions_refusal(
    events_table, alice, as_user
):
    client = as_user(alice)
    client.post(reverse("retention:version_create"), {"toml": policy_toml()})
    version = PolicyVersion.objects.get()

    page = client.post(version_url("version_submit", version), {"reason": "  "}, follow=True)

    assert "submitting a version needs a reason" in page.content.decode()
    version.refresh_from_db()
    assert version.state == "draft" and not version.preview
    assert not OperatorAction.objects.filter(action="version.submit").exists()
    with pytest.raises(ActionError, match="^submitting a version needs a reason$"):
        actions.submit_version(version, actor=alice, reason="")


def test_pasting_bad_toml_shows_one_error_and_changes_nothing(events_table, alice, as_user):
    page = as_user(alice).post(
        reverse("retention:version_create"), {"toml": policy_toml(table='"public.nope"')}
    )
    assert page.status_code == 400
    assert "table public.nope does not exist" in page.content.decode()
    assert Policy.objects.count() == 0 and PolicyVersion.objects.count() == 0


def test_a_fresh_preview_comes_back_as_a_fragment(events_table, alice, bob, as_user):
    version = submitted(alice)
    page = as_user(bob).get(version_url("version_preview", version), HTTP_HX_REQUEST="true")
    html = page.content.decode()
    assert "Live preview as of" in html
    assert f'data-eligible="{version.preview["eligible"]}"' in html
    assert "<html" not in html


def test_holds_are_placed_and_released_from_the_holds_page(events_table, alice, bob, as_user):
    submitted(alice)
    client = as_user(alice)

    client.post(
        reverse("retention:hold_place"),
        {"policy": "events", "tenant": "3", "key_from": "", "key_to": "900", "reason": "case 9"},
    )
    hold = LegalHold.objects.get()
    assert (hold.policy.slug, hold.tenant, hold.key_from, hold.key_to) == ("events", "3", None, 900)
    html = client.get(reverse("retention:holds")).content.decode()
    assert f'data-hold="{hold.pk}"' in html and "case 9" in html

    assert reverse("retention:hold_detail", args=[hold.pk]) in html

    client.post(reverse("retention:hold_release_request", args=[hold.pk]), {"reason": "closed"})
    hold.refresh_from_db()
    assert hold.active and hold.release_requested_by == "alice"
    assert (
        'data-testid="release-pending"' in client.get(reverse("retention:holds")).content.decode()
    )
    as_user(bob).post(
        reverse("retention:hold_release_approve", args=[hold.pk]),
        {"reason": "ok", "password": "bob-pw"},  # the password again, as for an approval
    )
    hold.refresh_from_db()
    assert hold.released_by == "bob" and hold.release_reason == "ok"


def test_a_bad_key_bound_on_the_hold_form_is_refused(events_table, alice, as_user):
    page = as_user(alice).post(
        reverse("retention:hold_place"), {"key_from": "ten", "reason": "x"}, follow=True
    )
    assert "key from must be a whole number" in page.content.decode()
    assert LegalHold.objects.count() == 0


def test_oncall_pauses_a_policy_from_its_page(events_table, alice, olga, as_user):
    submitted(alice)
    client = as_user(olga)
    client.post(reverse("retention:policy_pause", args=["events"]), {"reason": "incident 12"})
    policy = Policy.objects.get()
    assert policy.paused and policy.paused_reason == "incident 12"
    html = client.get(reverse("retention:policy_detail", args=["events"])).content.decode()
    assert "Resume policy" in html
    assert (
        as_user(alice)
        .post(reverse("retention:policy_resume", args=["events"]), {"reason": "x"})
        .status_code
        == 403
    )


def test_the_admin_shows_versions_and_actions_read_only(events_table, alice, client):
    version = submitted(alice)
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    page = client.get(reverse("admin:retention_policyversion_change", args=[version.pk]))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    action = OperatorAction.objects.first()
    page = client.get(reverse("admin:core_operatoraction_change", args=[action.pk]))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get(reverse("admin:retention_legalhold_changelist")).status_code == 200


def test_approving_asks_for_the_password_again_so_a_taken_session_alone_cannot_approve(
    events_table, alice, bob, as_user
):
    version = submitted(alice)
    client = as_user(bob)  # a session, as a stolen cookie would give
    assert (
        'data-testid="reauth-password"'
        in client.get(version_url("version_detail", version)).content.decode()
    )

    for form, refusal in (
        ({"reason": "checked"}, "enter your password to confirm the approval of events v1"),
        ({"reason": "checked", "password": "guess"}, "wrong password: the approval of events v1"),
    ):
        page = client.post(version_url("version_approve", version), form, follow=True)
        assert refusal in page.content.decode()
        version.refresh_from_db()
        assert version.state == "submitted"
    assert not OperatorAction.objects.filter(action="version.approve").exists()

    client.post(version_url("version_approve", version), {"reason": "ok", "password": "bob-pw"})
    version.refresh_from_db()
    assert version.state == "approved"
    # for the next few minutes the password is not asked again
    assert (
        'data-testid="reauth-password"'
        not in client.get(version_url("version_detail", version)).content.decode()
    )


def test_a_password_confirmed_longer_ago_than_the_reauth_window_is_asked_again(
    events_table, alice, bob, as_user, settings
):
    """Sudo mode lasts ``REAUTH_WINDOW_S``: a password confirmed one second longer ago than
    that no longer approves; the page asks for it again and an approval without it is refused."""
    import time

    from core import reauth

    version = submitted(alice)
    client = as_user(bob)
    session = client.session
    session[reauth.SESSION_KEY] = time.time() - settings.REAUTH_WINDOW_S - 1
    session.save()
    assert (
        'data-testid="reauth-password"'
        in client.get(version_url("version_detail", version)).content.decode()
    )
    page = client.post(version_url("version_approve", version), {"reason": "ok"}, follow=True)
    assert "enter your password to confirm the approval of events v1" in page.content.decode()
    version.refresh_from_db()
    assert version.state == "submitted"
    # confirmed within the window: no password needed
    session = client.session
    session[reauth.SESSION_KEY] = time.time() - settings.REAUTH_WINDOW_S + 60
    session.save()
    client.post(version_url("version_approve", version), {"reason": "ok"})
    version.refresh_from_db()
    assert version.state == "approved"
