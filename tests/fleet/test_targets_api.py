"""Targets over the HTTP API and its client: list, add, remove — the client prints what
``manage.py retention target …`` prints, and no answer carries a connection string."""

from __future__ import annotations

import json

import pytest

from core.tokens import create_token
from targets.models import Target
from tests.api.live import with_api
from tests.fleet.conftest import SECRET, with_password

pytestmark = pytest.mark.django_db(transaction=True)


def _client(live_server, token: str, argv: list[str]) -> tuple[int, str, str]:
    """``retention ARGS`` as the API client package, in a process of its own."""
    done = with_api(argv, url=live_server.url, token=token)
    return done.returncode, done.stdout, done.stderr


def test_targets_over_the_api_client(fleet_databases, live_server, make_user, monkeypatch):
    oncall = make_user("olga", "oncall")
    viewer = make_user("vera", "viewer")
    _, oncall_token = create_token(oncall, name="t")
    _, viewer_token = create_token(viewer, name="t")
    monkeypatch.setenv("API_DSN", with_password(fleet_databases[1].url))

    code, out, err = _client(live_server, oncall_token,
                             ["target", "add", "messages", "--dsn-env", "API_DSN", "--group", "m"])  # fmt: skip
    assert code == 0, err
    assert "target messages added in group m (env API_DSN); it answered" in out
    assert Target.objects.get(name="messages").group == "m"

    code, out, err = _client(live_server, viewer_token, ["target", "list"])
    assert code == 0, err
    assert "messages" in out and "env API_DSN" in out and SECRET not in out

    code, out, err = _client(live_server, viewer_token, ["target", "remove", "messages"])
    assert code == 1 and "oncall" in err
    code, out, err = _client(live_server, oncall_token,
                             ["target", "add", "bad", "--dsn-env", "API_UNSET"])  # fmt: skip
    assert code == 1
    assert err.strip() == "CommandError: target bad: environment variable API_UNSET is not set here"
    code, out, err = _client(live_server, oncall_token, ["target", "migrate", "messages"])
    assert code == 1 and "run it on the server" in err

    code, out, err = _client(live_server, oncall_token,
                             ["target", "remove", "messages", "--reason", "moved"])  # fmt: skip
    assert code == 0, err
    assert not Target.objects.exists()


def test_the_api_answer_names_the_source_only(fleet_databases, client, make_user, monkeypatch):
    monkeypatch.setenv("API_DSN", with_password(fleet_databases[0].url))
    Target.objects.create(name="payments", dsn_env="API_DSN", group="pay")
    _, token = create_token(make_user("vera", "viewer"), name="t")
    response = client.get("/api/v1/targets", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    data = response.json()
    assert [t["name"] for t in data["targets"]] == ["payments"]
    assert data["targets"][0]["reference"] == "env API_DSN"
    assert SECRET not in json.dumps(data)
