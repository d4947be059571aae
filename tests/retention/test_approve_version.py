from __future__ import annotations

import io
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import Schedule

from core.models import OperatorAction
from retention import actions
from retention.actions import ActionError
from retention.models import Policy, PolicyVersion
from retention.schedule_math import next_tick
from retention.spec import load_toml
from runs.engine.schedules import schedule_name
from tests.conftest import token_for_claim

from .conftest import policy_toml


def submitted(author, **overrides) -> PolicyVersion:
    version = actions.apply_spec(load_toml(policy_toml(**overrides)), author=author)
    return actions.submit_version(version, actor=author, reason="ready for review")


def run_cli(*args: str) -> str:
    token_for_claim(args)
    out = io.StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def test_the_author_cannot_approve_their_own_version(events_table, alice):
    version = submitted(alice)

    with pytest.raises(ActionError, match="alice wrote events v1 and cannot approve it"):
        actions.approve_version(version, actor=alice, reason="reviewed")

    version.refresh_from_db()
    assert version.state == "submitted"
    assert not OperatorAction.objects.filter(action="version.approve").exists()


def test_the_author_cannot_approve_through_the_cli_either(events_table, alice):
    submitted(alice)

    with pytest.raises(CommandError) as excinfo:
        run_cli(
            "policy", "approve", "events", "--version", "1", "--approver", "alice",
            "--reason", "mine",
        )  # fmt: skip

    assert "cannot approve it" in str(excinfo.value)
    assert "\n" not in str(excinfo.value)
    assert PolicyVersion.objects.get().state == "submitted"


def test_a_user_outside_compliance_cannot_approve(events_table, alice, olga):
    version = submitted(alice)

    with pytest.raises(PermissionDenied):
        actions.approve_version(version, actor=olga, reason="reviewed")
    with pytest.raises(CommandError, match="requires one of the roles: compliance"):
        run_cli(
            "policy", "approve", "events", "--version", "1", "--approver", "olga",
            "--reason", "reviewed",
        )  # fmt: skip
    assert PolicyVersion.objects.get().state == "submitted"


def test_approval_by_another_officer_binds_the_hash_and_syncs_the_schedule(
    events_table, alice, bob
):
    version = submitted(alice, schedule='"15 2 * * *"', name='"Events older than 30 days"')

    assert not Schedule.objects.filter(name=schedule_name(version.policy)).exists()
    actions.approve_version(version, actor=bob, reason="reviewed with legal")

    version.refresh_from_db()
    assert version.state == "approved"
    assert version.approved_hash == version.content_hash
    assert version.decided_by == bob
    assert version.decision_reason == "reviewed with legal"
    policy = Policy.objects.get()
    assert (policy.schedule, policy.name) == ("15 2 * * *", "Events older than 30 days")
    assert policy.approved_version == version
    # the schedule is armed for the policy's next tick, in the approval's transaction
    schedule = Schedule.objects.get(name=schedule_name(policy))
    assert schedule.next_run == next_tick(policy, schedule.next_run - timedelta(minutes=1))
    assert schedule.next_run.astimezone(ZoneInfo(policy.timezone)).strftime("%H:%M") == "02:15"
    action = OperatorAction.objects.get(action="version.approve")
    assert action.actor == "bob"
    assert action.details["content_hash"] == version.content_hash
    assert action.details["preview_eligible"] == version.preview["eligible"]


def test_approving_a_new_version_supersedes_the_previous_one(events_table, alice, bob):
    first = submitted(alice)
    actions.approve_version(first, actor=bob, reason="reviewed")
    second = submitted(alice, retention='"60 days"')

    run_cli("policy", "approve", "events", "--version", "2", "--approver", "bob", "--reason", "ok")

    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == ("superseded", "approved")
    assert PolicyVersion.objects.filter(state="approved").count() == 1


def test_approval_is_refused_when_the_content_no_longer_matches_its_hash(events_table, alice, bob):
    version = submitted(alice)
    tampered = dict(version.spec, retention="1 days")
    PolicyVersion.objects.filter(pk=version.pk).update(spec=tampered)

    with pytest.raises(ActionError, match="does not match the hash"):
        actions.approve_version(version, actor=bob, reason="reviewed")

    assert PolicyVersion.objects.get().state == "submitted"


def test_approval_without_a_reason_is_refused_by_the_action_and_the_cli(events_table, alice, bob):
    version = submitted(alice)

    for reason in ("", "   "):
        with pytest.raises(ActionError, match="approving a version needs a reason"):
            actions.approve_version(version, actor=bob, reason=reason)
    with pytest.raises(ActionError, match="approving a version needs a reason"):
        actions.approve_version(version, actor=bob)
    with pytest.raises(CommandError, match="approving a version needs a reason"):
        run_cli("policy", "approve", "events", "--version", "1", "--approver", "bob")

    version.refresh_from_db()
    assert (version.state, version.decided_by, version.decision_reason) == ("submitted", None, "")
    assert not OperatorAction.objects.filter(action="version.approve").exists()


def test_only_a_submitted_version_can_be_approved(events_table, alice, bob):
    draft = actions.apply_spec(load_toml(policy_toml()), author=alice)

    with pytest.raises(ActionError, match="only a submitted version can be approved"):
        actions.approve_version(draft, actor=bob, reason="reviewed")


def test_rejection_needs_a_reason_and_a_different_officer(events_table, alice, bob):
    version = submitted(alice)

    with pytest.raises(ActionError, match="needs a reason"):
        actions.reject_version(version, actor=bob, reason="  ")
    with pytest.raises(ActionError, match="cannot decide on it"):
        actions.reject_version(version, actor=alice, reason="withdrawn")

    out = run_cli(
        "policy", "reject", "events", "--version", "1", "--approver", "bob", "--reason", "too short"
    )

    assert out.strip() == "events v1 rejected by bob"
    version.refresh_from_db()
    assert (version.state, version.decision_reason) == ("rejected", "too short")
    assert OperatorAction.objects.get(action="version.reject").reason == "too short"


def test_an_unknown_approver_or_version_gives_one_error_line(events_table, alice):
    submitted(alice)

    with pytest.raises(CommandError, match="set RETENTION_TOKEN"):
        run_cli("policy", "approve", "events", "--version", "1", "--approver", "nobody")
    with pytest.raises(CommandError, match="policy 'events' has no version 9"):
        run_cli("policy", "approve", "events", "--version", "9", "--approver", "alice")
    assert PolicyVersion.objects.get().state == "submitted"


def test_pausing_needs_oncall_and_a_reason(events_table, alice, olga):
    submitted(alice)
    policy = Policy.objects.get()

    with pytest.raises(PermissionDenied):
        actions.pause_policy(policy, actor=alice, reason="noisy")
    with pytest.raises(ActionError, match="needs a reason"):
        actions.pause_policy(policy, actor=olga, reason="")
    actions.pause_policy(policy, actor=olga, reason="replica lag incident")
    policy.refresh_from_db()
    assert policy.paused and policy.paused_reason == "replica lag incident"

    actions.resume_policy(policy, actor=olga, reason="lag recovered")
    policy.refresh_from_db()
    assert not policy.paused
    assert list(
        OperatorAction.objects.filter(target_type="policy")
        .order_by("id")
        .values_list("action", "reason")
    ) == [
        ("policy.create", ""),
        ("policy.pause", "replica lag incident"),
        ("policy.resume", "lag recovered"),
    ]


def test_whoever_submitted_a_version_written_by_someone_else_cannot_approve_it(
    events_table, alice, bob, make_user
):
    carol = make_user("carol", "compliance")
    draft = actions.apply_spec(load_toml(policy_toml()), author=alice)
    version = actions.submit_version(draft, actor=bob, reason="ready for review")

    with pytest.raises(ActionError, match="bob submitted events v1 and cannot approve it"):
        actions.approve_version(version, actor=bob, reason="looks fine")
    with pytest.raises(ActionError, match="bob submitted events v1"):
        actions.reject_version(version, actor=bob, reason="withdrawn")
    version.refresh_from_db()
    assert version.state == "submitted"
    assert version.submitted_by == bob

    actions.approve_version(version, actor=carol, reason="a third pair of eyes")
    version.refresh_from_db()
    assert (version.state, version.decided_by) == ("approved", carol)


def test_submitting_the_same_content_again_is_writing_it_too(events_table, alice, bob):
    """apply_spec returns an existing draft for identical content; whoever submits it then
    is one of its hands and cannot approve it."""
    actions.apply_spec(load_toml(policy_toml()), author=alice)
    same = actions.apply_spec(load_toml(policy_toml()), author=bob)
    version = actions.submit_version(same, actor=bob, reason="ready for review")

    for officer in (alice, bob):
        with pytest.raises(ActionError, match="cannot approve it"):
            actions.approve_version(version, actor=officer, reason="mine")
    assert PolicyVersion.objects.get().state == "submitted"
