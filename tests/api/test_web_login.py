"""The web process's own database login serves the API: gunicorn connected with exactly what
``retention grants apply --web`` gives runs a pipeline's and an on-call's commands through the
client, records each token's last use, and writes the operator log."""

from __future__ import annotations

import pytest

from core.models import ApiToken, OperatorAction
from core.tokens import create_token
from retention.models import PolicyVersion
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.engine import planner
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.security.conftest import worker_role as login_role  # noqa: F401 - a fixture
from tests.security.roles import apply_grants, url_as

from .live import gunicorn, with_api

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_the_web_login_serves_every_kind_of_call(login_role, make_user, tmp_path):  # noqa: F811
    role, password = login_role
    create_events(1200)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    apply_grants("web", role, "public.rr_events")
    tokens = {
        who: create_token(make_user(who, kind), name="web login")[1]
        for who, kind in (("oscar", "oncall"), ("carla", "compliance"), ("audrey", "auditor"))
    }
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "events.toml").write_text(
        PolicySpec.parse(events_spec(retention="25 days")).to_toml()
    )

    with gunicorn(url_as(role, password)) as url:

        def ok(who: str, *args: str, code: int = 0) -> str:
            result = with_api(args, url=url, token=tokens[who])
            assert result.returncode == code, (args, result.stdout, result.stderr)
            return result.stdout

        assert ok("oscar", "status", run.run_key).startswith(
            f"run_key                    {run.run_key}"
        )
        assert ok("oscar", "pause", run.run_key, "--reason", "INC-1") == f"{run.run_key}: paused\n"
        assert ok("oscar", "resume", run.run_key, "--reason", "over") == f"{run.run_key}: active\n"
        assert ok("oscar", "kill-switch", "on", "--reason", "INC-2") == "kill switch on\n"
        assert ok("oscar", "kill-switch", "off", "--reason", "over") == "kill switch off\n"
        assert "eligible" in ok("carla", "policy", "preview", "events")
        assert ok("audrey", "audit", "verify").startswith("audit chain intact")
        assert "placed" in ok("carla", "hold", "place", "--reason", "LIT-1", "--tenant", "2")
        assert "plan: 1 change(s)" in ok("carla", "policy", "plan", str(folder), code=2)
        assert "events v2 submitted" in ok(
            "carla", "policy", "apply", str(folder), "--reason", "PR #1", code=2
        )

    assert PolicyVersion.objects.filter(policy=policy, number=2, state="submitted").exists()
    assert ApiToken.objects.filter(last_used_at__isnull=False).count() == 3
    assert set(
        OperatorAction.objects.filter(details__via="api").values_list("action", flat=True)
    ) >= {"run.pause", "run.resume", "kill_switch.on", "kill_switch.off", "hold.place",
          "version.create", "version.submit"}  # fmt: skip
