"""Signed checkpoints need only the public half to check (docs/security.md):

- the monitor login may insert checkpoint rows (the checkpoint job stores its anchors with
  it), but a row it writes without the job's key is never served as "the latest signed
  checkpoint" — not on the API, not in a run manifest — and ``audit verify`` names it;
- on a web host that holds no evidence key (the correct deployment), ``POST
  /api/v1/audit/verify`` checks an anchor's signature with ``RETENTION_EVIDENCE_PUBLIC_KEY``
  alone, and refuses a forged one."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from core.tokens import create_token
from retention.actions import pause_policy
from runs.evidence import anchors
from runs.models import Checkpoint
from tests.factories import approved_policy, events_spec
from tests.security.roles import connect_as
from tests.security.test_logins import logins  # noqa: F401 — the fixture

pytestmark = pytest.mark.django_db(transaction=True)

KEY = b"evidence-key-kept-off-the-database-host-0123456789"


def call(method: str, path: str, token: str, body=None):
    response = Client().generic(
        method, f"/api/v1{path}", json.dumps(body) if body is not None else "",
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip
    return response.status_code, json.loads(response.content)


@pytest.fixture
def web_host(logins, make_user, settings):  # noqa: F811
    """A chained operator log and an auditor's token; this process is a web host: no evidence
    key, only its public half. ``sign()`` is the checkpoint job (with the key) taking one."""
    pause_policy(approved_policy(make_user, **events_spec()), actor="guard", reason="chained")
    settings.RETENTION_EVIDENCE_KEY = KEY
    settings.RETENTION_EVIDENCE_PUBLIC_KEY = bytes.fromhex(anchors.public_key_hex())
    settings.RETENTION_EVIDENCE_KEY = None
    _, token = create_token(make_user("audrey", "auditor"), name="evidence")

    def sign() -> Checkpoint:
        settings.RETENTION_EVIDENCE_KEY = KEY
        try:
            return anchors.take_checkpoint()
        finally:
            settings.RETENTION_EVIDENCE_KEY = None

    return token, sign


def forge(logins, *signatures: str) -> list[Checkpoint]:  # noqa: F811
    """Checkpoint rows as the monitor login writes them without the key."""
    with connect_as(*logins["monitor"]) as monitor:
        for signature in signatures:
            monitor.execute(
                "INSERT INTO runs_checkpoint (at, audit_seq, audit_hash, operator_seq,"
                " operator_hash, hmac, host) VALUES (now(), 99, %s, 99, %s, %s, 'laptop')",
                ["f" * 64, "e" * 64, signature],
            )
    return list(Checkpoint.objects.filter(host="laptop").order_by("id"))


def test_a_checkpoint_row_the_monitor_login_writes_alone_is_never_served(
    logins,  # noqa: F811
    web_host,
):
    token, sign = web_host
    # no genuine checkpoint yet: a forged row is not served as one
    forge(logins, "ed25519:" + "ab" * 64)
    status, answer = call("GET", "/audit/checkpoint", token)
    assert (status, answer["code"]) == (404, "not_found")
    assert anchors.status(anchors.latest_checkpoint()).startswith("No verified checkpoint")

    genuine = sign()
    # newer rows: a made-up signature, and the genuine one copied onto another body
    forged = forge(logins, "ed25519:" + "cd" * 64, genuine.signature)
    assert len(forged) == 3 and forged[-1].pk > genuine.pk > forged[0].pk

    status, served = call("GET", "/audit/checkpoint", token)
    assert status == 200
    assert served == anchors.document(genuine)
    assert served["signature"] == genuine.signature and served["audit"]["seq"] != 99

    status, answer = call("POST", "/audit/verify", token, {"anchors": []})
    assert (status, answer["code"]) == (400, "command_failed")
    for row in forged:
        assert f"checkpoint #{row.pk} of " in answer["stderr"]
    assert f"checkpoint #{genuine.pk} " not in answer["stderr"]
    assert answer["stderr"].count("signature does not match") == 3


def test_audit_verify_checks_an_anchor_with_the_public_key_alone(web_host, settings):
    token, sign = web_host
    document = anchors.document(sign())
    assert settings.RETENTION_EVIDENCE_KEY is None

    status, answer = call("POST", "/audit/verify", token, {"anchors": [document]})
    assert status == 200, answer
    assert answer["stdout"].rstrip().endswith(", 1 anchor(s) hold")

    tampered = {**document, "operator": {**document["operator"], "seq": 1}}
    status, answer = call("POST", "/audit/verify", token, {"anchors": [tampered]})
    assert (status, answer["code"]) == (400, "command_failed")
    assert "the anchor's signature does not match" in answer["stderr"]

    settings.RETENTION_EVIDENCE_PUBLIC_KEY = None  # no key of any kind: it says so
    status, answer = call("POST", "/audit/verify", token, {"anchors": [document]})
    assert (status, answer["code"]) == (400, "command_failed")
    assert (
        "cannot check its signature: RETENTION_EVIDENCE_PUBLIC_KEY is not set" in answer["stderr"]
    )
