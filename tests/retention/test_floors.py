"""Retention floors: compliance sets a minimum per table (a second officer approves); a
version below the floor in force is refused at apply and approve — on the command line, over
the API and on the pages — and a run re-checks it at trigger. A compliance floor is never
lowered, by the product nor by a direct write with the owner's login; a governance floor is
lowered by a superuser and another officer, after a wait."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import OperatorAction
from core.oplog import ActionError, NeedsAnotherPerson
from retention import actions, floors
from retention.models import PolicyVersion, RetentionFloor
from retention.spec import load_toml
from runs.actions import resume_run, trigger_run
from runs.evidence.exports import manifest_header
from runs.models import Run
from tests.api.conftest import Api
from tests.retention.conftest import policy_toml

pytestmark = pytest.mark.usefixtures("no_guard")


def _cli(*args) -> str:
    out = io.StringIO()
    call_command("retention", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _floor(alice, bob, period: str = "60 days", mode: str = "compliance") -> RetentionFloor:
    floor = actions.request_floor("public.t_events", period, mode=mode, actor=alice, reason="law")
    return actions.approve_floor(floor, actor=bob, reason="checked")


def test_a_floor_is_requested_and_approved_by_two_officers_on_the_command_line(
    events_table, alice, bob, act_as
):
    act_as(alice)
    out = _cli("floor", "set", "public.t_events", "6 years", "--mode", "compliance",
               "--reason", "tax law", "--by", "alice")  # fmt: skip
    assert out.startswith("floor #")
    floor = RetentionFloor.objects.get()
    assert out.startswith(f"floor #{floor.pk} requested on public.t_events: 6 years, compliance")
    assert floors.in_force("public", "t_events") is None  # not before the second officer
    with pytest.raises(CommandError, match="cannot approve it; another member"):
        _cli("floor", "approve", str(floor.pk), "--reason", "mine")
    with pytest.raises(CommandError, match="--by bob is not who is acting"):
        _cli("floor", "approve", str(floor.pk), "--reason", "ok", "--by", "bob")
    act_as(bob)
    out = _cli("floor", "approve", str(floor.pk), "--reason", "checked", "--by", "bob")
    assert "approved by bob" in out and "[approved]" in out
    assert floors.in_force("public", "t_events") == floor
    assert OperatorAction.objects.filter(action="floor.approve", actor="bob").count() == 1
    # the database refuses an approval by the requester too
    other = actions.request_floor("public.t_events", "7 years", mode="compliance", actor=alice,
                                  reason="more")  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():
        RetentionFloor.objects.filter(pk=other.pk).update(
            approved_by="alice", approved_at=timezone.now(), effective_at=timezone.now()
        )


def test_a_floor_is_requested_approved_refused_and_listed_over_the_api(
    events_table, alice, bob, make_user
):
    """The API runs the command line's handlers: the same roles, the same four eyes, the same
    refusals; a viewer reads the floors and decides none."""
    from core.tokens import create_token

    vera = make_user("vera", "viewer")
    api = Api({u.username: create_token(u, name="t")[1] for u in (alice, bob, vera)})
    body = {"table": "public.t_events", "period": "6 years", "mode": "compliance",
            "reason": "tax law"}  # fmt: skip
    assert api.post("/floors", body, as_="vera")[0] == 403
    status, placed = api.post("/floors", body, as_="alice")
    assert status == 200, placed
    floor = RetentionFloor.objects.get(pk=placed["id"])
    assert placed["output"]["stdout"].startswith(f"floor #{floor.pk} requested on public.t_events")
    status, error = api.post(f"/floors/{floor.pk}/approve", {"reason": "mine"}, as_="alice")
    assert (status, error["code"]) == (403, "four_eyes"), error
    assert api.post(f"/floors/{floor.pk}/approve", {"reason": "ok"}, as_="vera")[0] == 403
    status, done = api.post(f"/floors/{floor.pk}/approve", {"reason": "checked"}, as_="bob")
    assert status == 200 and "approved by bob" in done["output"]["stdout"], done
    assert floors.in_force("public", "t_events") == floor
    status, shown = api.get(f"/floors/{floor.pk}", as_="vera")
    assert status == 200 and (shown["state"], shown["approved_by"]) == ("approved", "bob")
    # a compliance floor is never lowered, over the API either
    status, error = api.post("/floors", {**body, "period": "1 year"}, as_="bob")
    assert status == 409 and "can never be lowered" in error["message"], error
    # a request refused by the other officer never comes into force
    status, placed = api.post("/floors", {**body, "period": "7 years"}, as_="bob")
    status, done = api.post(f"/floors/{placed['id']}/refuse", {"reason": "no"}, as_="alice")
    assert status == 200 and "refused by alice" in done["output"]["stdout"], done
    status, listed = api.get("/floors", as_="vera")
    assert status == 200
    assert [(f["id"], f["state"]) for f in listed["floors"]] == [
        (placed["id"], "refused"), (floor.pk, "approved")
    ]  # fmt: skip
    assert f"floor #{floor.pk} on public.t_events: 6 years" in listed["output"]["stdout"]
    assert api.get("/floors/999999", as_="vera")[0] == 404
    assert OperatorAction.objects.filter(action="floor.approve", actor="bob").count() == 1


def test_a_version_below_a_compliance_floor_is_refused_at_apply_and_approve(
    events_table, alice, bob, act_as, tmp_path, make_user
):
    """CLI: exit 1 with a message naming the floor; the API and the pages refuse alike."""
    # a version submitted before the floor: its approval is refused once the floor is in force
    early = actions.apply_spec(load_toml(policy_toml(retention='"30 days"')), author=alice)
    early = actions.submit_version(early, actor=alice, reason="ready")
    floor = _floor(alice, bob, "60 days")

    path = tmp_path / "short.toml"
    path.write_text(policy_toml(retention='"45 days"'))
    act_as(alice)
    with pytest.raises(CommandError) as refused:
        _cli("policy", "apply", str(path), "--reason", "shorter")
    message = str(refused.value)
    assert "floor" in message and f"floor #{floor.pk}" in message
    assert "60 days, compliance mode, set by alice" in message and "'45 days'" in message
    assert PolicyVersion.objects.count() == 1
    # an override or a class below the floor is refused the same way
    with pytest.raises(ActionError, match=r"override\[0\] \(3\) '10 days'"):
        actions.apply_spec(load_toml(policy_toml(
            retention='"90 days"',
            tables='[[override]]\ntenant = 3\nretention = "10 days"\n')), author=alice)  # fmt: skip
    with pytest.raises(ActionError, match="class"):
        actions.apply_spec(load_toml(policy_toml(
            retention='"90 days"',
            tables='[[class]]\ncolumn = "status"\nvalue = "open"\nretention = "1 day"\n')),
            author=alice)  # fmt: skip
    # longer overrides, "forever" and classes at or above the floor are fine
    ok = actions.apply_spec(load_toml(policy_toml(
        retention='"60 days"',
        tables='[[override]]\ntenant = [3, 4]\nretention = "forever"\n'
               '[[class]]\ncolumn = "status"\nvalue = "open"\nretention = "3 months"\n')),
        author=alice)  # fmt: skip
    assert ok.state == PolicyVersion.State.DRAFT

    act_as(bob)
    with pytest.raises(CommandError, match=f"floor #{floor.pk}"):
        _cli("policy", "approve", "events", "--version", str(early.number), "--reason", "ok")
    early.refresh_from_db()
    assert early.state == PolicyVersion.State.SUBMITTED

    # the API: apply and approve
    carla = make_user("carla", "compliance")
    carla.set_password("carla-pw")
    carla.save()
    from core.tokens import create_token

    api = Api(
        {"alice": create_token(alice, name="t")[1], "carla": create_token(carla, name="t")[1]}
    )
    status, error = api.post(
        "/policies", {"toml": policy_toml(retention='"45 days"'), "reason": "x"}, as_="alice"
    )
    assert status == 409 and "floor" in error["message"], error
    status, error = api.post(
        f"/policies/events/versions/{early.number}/approve",
        {"reason": "ok", "password": "carla-pw"},
        as_="carla",
    )
    assert status == 409 and f"floor #{floor.pk}" in error["message"], error
    early.refresh_from_db()
    assert early.state == PolicyVersion.State.SUBMITTED

    # the pages: the upload and the approval
    from django.test import Client

    client = Client()
    client.force_login(alice)
    page = client.post(
        reverse("retention:version_create"), {"toml": policy_toml(retention='"45 days"')}
    )
    assert page.status_code == 400 and f"floor #{floor.pk}" in page.content.decode()
    bob.set_password("bob-pw")
    bob.save()
    client.force_login(bob)
    card = client.get(reverse("retention:approvals")).content.decode()
    assert f"floor #{floor.pk}: <strong>60 days</strong>, compliance mode, set by alice" in card
    assert "below it: approving is refused" in card
    page = client.post(
        reverse("retention:version_approve", args=["events", early.number]),
        {"reason": "ok", "password": "bob-pw"},
        follow=True,
    )
    assert f"floor #{floor.pk}" in page.content.decode()
    early.refresh_from_db()
    assert early.state == PolicyVersion.State.SUBMITTED
    assert PolicyVersion.objects.count() == 2  # the early one and the fine draft


def test_a_floor_set_after_approval_stops_the_next_run_with_a_clear_reason(
    events_table, alice, bob
):
    version = actions.apply_spec(load_toml(policy_toml(retention='"30 days"')), author=alice)
    version = actions.submit_version(version, actor=alice, reason="ready")
    actions.approve_version(version, actor=bob, reason="ok")
    floor = _floor(alice, bob, "1 year")

    run, _ = trigger_run(version.policy, tick=timezone.now())
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION
    assert run.state_reason.startswith("stopped by a retention floor: ")
    assert f"floor #{floor.pk} on public.t_events: 1 year, compliance mode, set by alice" in (
        run.state_reason
    )
    assert not run.chunks.exists()
    assert OperatorAction.objects.filter(action="run.attention", target_id=str(run.pk)).exists()
    # it cannot be resumed past the floor; the floor is in its manifest and on the policy page
    olga = User.objects.create_user("olga2")
    from django.contrib.auth.models import Group

    from core.roles import ONCALL

    olga.groups.add(Group.objects.get_or_create(name=ONCALL)[0])
    with pytest.raises(ActionError, match=f"floor #{floor.pk}"):
        resume_run(run, actor=olga, reason="go on")
    shown = manifest_header(run)["floors"]
    assert [(f["id"], f["period"], f["mode"], f["state"], f["requested_by"], f["approved_by"])
            for f in shown] == [(floor.pk, "1 year", "compliance", "approved", "alice", "bob")]  # fmt: skip
    client = Client()
    client.force_login(alice)
    html = client.get(reverse("retention:policy_detail", args=["events"])).content.decode()
    assert (
        f"floor #{floor.pk} on <code>public.t_events</code>: <strong>1 year</strong>, compliance"
        " mode, set by alice, approved by bob"
    ) in html


def test_a_compliance_floor_is_never_lowered_by_the_product_nor_by_the_owners_login(
    events_table, alice, bob, make_user
):
    floor = _floor(alice, bob, "6 years")
    root = User.objects.create_superuser("root", password="root-pw")
    for period, mode in (("5 years", "compliance"), ("1 year", "governance"),
                         ("6 years", "governance")):  # fmt: skip
        for who in (alice, root):
            with pytest.raises(ActionError, match=f"floor #{floor.pk} .*compliance mode"):
                actions.request_floor("public.t_events", period, mode=mode, actor=who, reason="x")
    raised = _floor(alice, bob, "7 years")  # raising is always possible
    assert floors.in_force("public", "t_events") == raised

    # the test database's login owns the product's tables: the trigger refuses it anyway
    for statement, params in (
        ("UPDATE retention_retentionfloor SET period = '1 day' WHERE id = %s", [floor.pk]),
        ("DELETE FROM retention_retentionfloor WHERE id = %s", [floor.pk]),
        ("UPDATE retention_retentionfloor SET mode = 'governance' WHERE id = %s", [floor.pk]),
    ):
        with pytest.raises(DatabaseError, match="never"), transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(statement, params)
    with connection.cursor() as cur:
        cur.execute("SELECT tableowner = current_user FROM pg_tables"
                    " WHERE tablename = 'retention_retentionfloor'")  # fmt: skip
        assert cur.fetchone()[0] is True
    # a lower floor written straight into the table, approved, is refused
    with pytest.raises(DatabaseError, match="compliance-mode floor .* never lowered"):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                'INSERT INTO retention_retentionfloor (schema, "table", period, mode,'
                " requested_by, requested_at, request_reason, lowers, approved_by, approved_at,"
                " approve_reason, effective_at, refused_by, refuse_reason)"
                " VALUES ('public', 't_events', '1 day', 'governance', 'x', now(), 'x', true,"
                " 'y', now(), 'y', now(), '', '')"
            )
    assert floors.in_force("public", "t_events").period == "7 years"


def test_a_governance_floor_is_lowered_by_a_superuser_and_another_officer_after_the_wait(
    events_table, alice, bob, settings
):
    settings.RETENTION = {**settings.RETENTION, "FLOOR_LOWERING_WAIT_S": 3 * 86400}
    floor = _floor(alice, bob, "2 years", mode="governance")
    with pytest.raises(ActionError, match="lowering it takes a superuser"):
        actions.request_floor("public.t_events", "1 year", mode="governance", actor=alice,
                              reason="contract changed")  # fmt: skip
    root = User.objects.create_superuser("root", password="root-pw")
    lower = actions.request_floor("public.t_events", "1 year", mode="governance", actor=root,
                                  reason="contract changed")  # fmt: skip
    assert lower.lowers and lower.replaces == floor
    with pytest.raises(NeedsAnotherPerson):
        actions.approve_floor(lower, actor=root, reason="mine")
    now = timezone.now()
    lower = actions.approve_floor(lower, actor=bob, reason="checked", now=now)
    assert lower.effective_at == now + timedelta(days=3)
    # during the wait the old floor holds: a 400-day version is still refused
    spec = load_toml(policy_toml(retention='"400 days"'))
    assert floors.in_force("public", "t_events") == floor
    with pytest.raises(ActionError, match=f"floor #{floor.pk}"):
        actions.apply_spec(spec, author=alice)
    assert floors.shown(lower)["state"] == "waiting"
    assert floors.in_force("public", "t_events", now=now + timedelta(days=2, hours=23)) == floor
    later = now + timedelta(days=3, seconds=1)
    assert floors.in_force("public", "t_events", now=later) == lower
    assert floors.violation(spec, now=later) is None
    assert floors.violation(load_toml(policy_toml(retention='"300 days"')), now=later)
