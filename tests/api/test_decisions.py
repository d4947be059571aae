"""Decisions over the API obey the pages' rules: four eyes, the password asked again for an
approval, decision fences (ETag / If-Match), the operator log saying ``via: api`` and which
token, one JSON error shape with a stable code."""

from __future__ import annotations

import pytest

from core.models import ApiToken, OperatorAction
from core.tokens import create_token
from retention.models import LegalHold, PolicyVersion
from runs.actions import pause_run, resume_run
from runs.models import Run

pytestmark = pytest.mark.django_db


def approve_url(version) -> str:
    return f"/policies/{version.policy.slug}/versions/{version.number}/approve"


def test_an_author_cannot_approve_their_own_version_over_the_api(api, world):
    v2, author = world["v2"], world["author"]
    _, secret = create_token(author, name="author's laptop")

    status, error = api.post(
        approve_url(v2), {"reason": "mine", "password": "author-events-pw"}, token=secret
    )

    assert (status, error["code"]) == (403, "four_eyes")
    assert "another member of compliance must" in error["message"]
    v2.refresh_from_db()
    assert v2.state == PolicyVersion.State.SUBMITTED
    assert not OperatorAction.objects.filter(action="version.approve", target_id=str(v2.pk))


def test_an_approval_needs_the_password_again_and_a_token_alone_cannot_approve(api, world):
    v2 = world["v2"]
    for body, message in (
        ({"reason": "ok"}, "send your password to confirm the approval"),
        ({"reason": "ok", "password": "wrong"}, "wrong password"),
    ):
        status, error = api.post(approve_url(v2), body, as_="compliance")
        assert (status, error["code"]) == (403, "password_required")
        assert message in error["message"]
    v2.refresh_from_db()
    assert v2.state == PolicyVersion.State.SUBMITTED

    status, data = api.post(
        approve_url(v2), {"reason": "reviewed", "password": "carla-pw"}, as_="compliance"
    )

    assert status == 200, data
    assert data["output"]["stdout"].startswith("events v2 approved by carla ")
    v2.refresh_from_db()
    assert v2.state == PolicyVersion.State.APPROVED
    row = OperatorAction.objects.get(action="version.approve", target_id=str(v2.pk))
    token = ApiToken.objects.get(user__username="carla")
    assert (row.actor, row.details["via"], row.details["token"]) == ("carla", "api", token.prefix)
    assert token.last_used_at is not None


def test_an_approval_whose_password_fails_too_often_is_locked_out_with_a_json_error(
    api, world, settings
):
    """The password asked again for an approval counts as a sign-in (django-axes): after the
    limit of wrong ones, the API answers 429 in its one error shape, not the sign-in page."""
    v2 = world["v2"]
    answers = []
    for _ in range(settings.LOGIN_FAILURE_LIMIT + 1):
        status, error = api.post(
            approve_url(v2), {"reason": "ok", "password": "wrong"}, as_="compliance"
        )
        answers.append((status, error["code"]))
    assert answers[0] == (403, "password_required")
    assert answers[-1] == (429, "throttled"), answers
    assert "too many failed passwords" in error["message"]
    v2.refresh_from_db()
    assert v2.state == PolicyVersion.State.SUBMITTED


def test_an_approval_on_a_version_read_in_another_state_is_refused(api, world, make_user):
    v2 = world["v2"]
    status, data = api.get(f"/policies/events/versions/{v2.number}", as_="compliance")
    etag = api.last["ETag"]
    assert status == 200 and etag == f'"{data["etag"]}"' and data["state"] == "submitted"
    status, _ = api.post(
        f"/policies/events/versions/{v2.number}/reject", {"reason": "no"}, as_="superuser"
    )
    assert status == 200

    status, error = api.post(
        approve_url(v2),
        {"reason": "ok", "password": "carla-pw"},
        as_="compliance",
        headers={"If-Match": etag},
    )

    assert (status, error["code"]) == (412, "stale_state")
    assert "it is now rejected" in error["message"]


def test_a_stale_resume_does_not_undo_a_newer_pause(api, world, people, make_user):
    run = world["run"]
    pause_run(run, actor=people["oncall"], reason="INC-1 replica lag")
    status, _ = api.get(f"/runs/{run.run_key}", as_="oncall")
    stale = api.last["ETag"]
    other = make_user("olga", "oncall")  # meanwhile: resumed, then paused again
    resume_run(run, actor=other, reason="INC-1 over")
    pause_run(run, actor=other, reason="INC-2 primary CPU")
    before = OperatorAction.objects.count()

    status, error = api.post(
        f"/runs/{run.run_key}/resume",
        {"reason": "INC-1 over"},
        as_="oncall",
        headers={"If-Match": stale},
    )

    assert (status, error["code"]) == (412, "stale_state")
    assert "paused by olga: INC-2 primary CPU" in error["message"]
    run.refresh_from_db()
    assert run.state == Run.State.PAUSED
    assert OperatorAction.objects.count() == before

    status, _ = api.get(f"/runs/{run.run_key}", as_="oncall")
    status, data = api.post(
        f"/runs/{run.run_key}/resume",
        {"reason": "INC-2 over"},
        as_="oncall",
        headers={"If-Match": api.last["ETag"]},
    )
    assert status == 200, data
    assert data["output"]["stdout"] == f"{run.run_key}: active\n"
    row = OperatorAction.objects.filter(action="run.resume").latest("chain_seq")
    assert (row.actor, row.details["via"]) == ("oscar", "api")


def test_a_hold_release_takes_two_people_over_the_api(api, world, people):
    hold = world["hold"]
    status, data = api.post(f"/holds/{hold.pk}/release", {"reason": "case closed"},
                            as_="compliance")  # fmt: skip
    assert status == 200, data

    status, error = api.post(
        f"/holds/{hold.pk}/approve-release", {"reason": "closed", "password": "carla-pw"},
        as_="compliance",
    )  # fmt: skip

    assert (status, error["code"]) == (403, "four_eyes")
    hold.refresh_from_db()
    assert hold.released_at is None
    # a token alone does not release: the approver's password again, as for an approval
    for password in ("", "wrong"):
        status, error = api.post(f"/holds/{hold.pk}/approve-release",
                                 {"reason": "closed", "password": password}, as_="superuser")  # fmt: skip
        assert (status, error["code"]) == (403, "password_required"), error
    assert LegalHold.objects.get(pk=hold.pk).released_at is None
    status, data = api.post(
        f"/holds/{hold.pk}/approve-release", {"reason": "closed", "password": "sue-pw"},
        as_="superuser",
    )  # fmt: skip
    assert status == 200, data
    assert LegalHold.objects.get(pk=hold.pk).released_by == "sue"


def test_errors_have_one_shape_with_a_stable_code(api, world):
    run = world["run"]
    cases = [
        (("GET", "/runs/no-such-run"), 404, "not_found"),
        (("POST", f"/runs/{run.run_key}/pause", {}), 409, "refused"),  # no reason
        (("POST", "/runs", {"policy": "events", "period": "yesterday"}), 400, "invalid"),
        (("POST", "/kill-switch", {"state": "sideways", "reason": "x"}), 422, "invalid_request"),
    ]
    for (method, path, *body), code, name in cases:
        status, error = api.call(method, path, body[0] if body else None, as_="oncall")
        assert (status, error["code"]) == (code, name), (path, error)
        assert set(error) <= {"code", "message", "stdout", "stderr"} and error["message"]
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


def test_a_token_past_its_budget_is_throttled(api, world, monkeypatch):
    from api.main import api as ninja_api

    throttle = ninja_api.throttle[0]
    monkeypatch.setattr(throttle, "num_requests", 2)
    codes = [api.get("/me", as_="viewer")[0] for _ in range(3)]
    status, error = api.get("/me", as_="viewer")
    assert codes[:2] == [200, 200]
    assert (status, error["code"]) == (429, "throttled")
    assert api.get("/me", as_="oncall")[0] == 200  # one budget per token
