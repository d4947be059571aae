"""A fleet's evidence: the checkpoint job signs every target's chains and stores the anchors in
the control database; the manifest of a policy's period lists every target's runs, rows
deleted, chain head and anchor (or that the target is unreachable); ``audit verify`` checks
every target's chain against its anchor and names the target whose chain was rewritten; no
connection string's password shows in any of it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from core.tokens import create_token
from runs.models import AuditRecord, Checkpoint
from targets import connections as C
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import SECRET, run_cli, with_password
from tests.runs.conftest import NOW, create_events
from tests.security.test_audit_anchor import KEY, rewrite_from

pytestmark = pytest.mark.django_db(transaction=True)

PERIOD = NOW.date().isoformat()


@pytest.fixture
def drained(fleet, make_user, act_as, no_guard, monkeypatch, settings):
    """``events`` over the three shards (their connection strings carrying a password), each
    target's run drained; the checkpoint job's key in this process."""
    settings.RETENTION_EVIDENCE_KEY = KEY.encode()
    for target in fleet:
        monkeypatch.setenv(target.env, with_password(target.url))
        with C.on(target.name):
            create_events(900, days=40)
    C.close_all()
    approved_policy(make_user, **events_spec(targets=["group:shards"], chunk_size=200))
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", PERIOD).split()
    run_cli("drain", "--until-idle", "--workers", "2")
    act_as(make_user("audrey", "auditor"))
    return keys


def verify(*against) -> tuple[str, str]:
    """(stdout, problems) of ``retention audit verify [--against …]``; problems '' if intact."""
    out, err = StringIO(), StringIO()
    args = ["--against", *map(str, against)] if against else []
    try:
        call_command("retention", "audit", "verify", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue(), err.getvalue() + str(exc)
    return out.getvalue(), ""


def checkpoint(path) -> dict:
    call_command("retention", "audit", "checkpoint", "--out", str(path), stdout=StringIO())
    return json.loads(path.read_text())


def manifest(path) -> dict:
    run_cli("evidence", "--policy", "events", "--period", PERIOD, "--manifest", str(path))
    return json.loads(path.read_text())


def test_a_periods_manifest_lists_every_targets_head_and_anchor_and_verifies(
    drained, fleet, tmp_path
):
    anchors = checkpoint(tmp_path / "checkpoint.json")["anchors"]
    # the control database's anchor first, then one per target, each signed with its name
    assert [a.get("target") for a in anchors] == [None, "shard1", "shard2", "shard3"]
    stored = Checkpoint.objects.exclude(target="").order_by("target")
    assert [c.target for c in stored] == ["shard1", "shard2", "shard3"]
    for target in fleet:  # stored in the control database only, none in the targets
        assert target.scalar("SELECT count(*) FROM retention_runner.runs_checkpoint") == 0

    document = manifest(tmp_path / "period.manifest.json")
    assert [e["target"] for e in document["targets"]] == ["shard1", "shard2", "shard3"]
    total = 0
    for entry, key in zip(document["targets"], drained, strict=True):
        name = entry["target"]
        assert entry["reachable"], entry
        (run,) = entry["runs"]
        assert run["run_key"] == key and run["state"] == "drained"
        assert run["run_records"]["ok"] and run["audit_records"] > 0
        with C.on(name):
            deleted = sum(AuditRecord.objects.values_list("rows_deleted", flat=True))
            head = AuditRecord.objects.order_by("-chain_seq").values("chain_seq", "hash").first()
        assert run["rows_deleted"] == entry["rows_deleted"] == deleted > 0
        assert entry["audit_chain"]["head_seq"] == head["chain_seq"]
        assert entry["audit_chain"]["head_hash"] == head["hash"]
        assert entry["anchor"]["target"] == name
        assert entry["anchor"]["audit"] == {"seq": head["chain_seq"], "hash": head["hash"]}
        assert entry["anchor_extension"]["audit"]["ok"], entry["anchor_extension"]
        assert entry["anchor_extension"]["audit"]["to_seq"] == head["chain_seq"]
        assert "of target " + name in entry["anchor_status"]
        total += deleted
    assert document["totals"] == {
        "targets": 3, "targets_read": 3, "unreachable": [], "runs": 3, "rows_deleted": total,
    }  # fmt: skip

    # the same document on the page (the overview links it for auditors and compliance)
    client = Client()
    client.force_login(User.objects.get(username="audrey"))
    assert 'data-testid="period-manifest"' in client.get("/").content.decode()
    page = client.get(f"/runs/periods/events/manifest.json?period={PERIOD}")
    assert page.status_code == 200 and "attachment" in page["Content-Disposition"]
    served = json.loads(page.content)
    assert [e["anchor"] for e in served["targets"]] == [e["anchor"] for e in document["targets"]]
    assert served["totals"] == document["totals"]
    assert client.get("/runs/periods/events/manifest.json?period=2026-13-01").status_code == 400
    (tmp_path / "page.manifest.json").write_bytes(page.content)

    # one target's run: its own manifest, read on its ledger, carrying that target's anchor
    run_cli("evidence", drained[1], "--manifest", str(tmp_path / "run.manifest.json"))
    one = json.loads((tmp_path / "run.manifest.json").read_text())
    assert one["run"]["run_key"] == drained[1]
    assert one["totals"]["rows_deleted"] == document["targets"][1]["rows_deleted"]
    assert one["anchor"] == document["targets"][1]["anchor"]
    assert one["anchor_extension"]["audit"]["ok"] and len(one["chunks"]) > 0
    _, token = create_token(User.objects.get(username="audrey"), name="evidence")
    answer = Client().get(
        f"/api/v1/runs/{drained[1]}/manifest.json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert answer.status_code == 200
    assert json.loads(b"".join(answer.streaming_content))["anchor"] == one["anchor"]

    out, problems = verify(
        tmp_path / "period.manifest.json",
        tmp_path / "checkpoint.json",
        tmp_path / "run.manifest.json",
    )
    assert problems == ""
    for name in ("shard1", "shard2", "shard3"):
        assert f"target {name}: audit chain intact" in out and "holds checkpoint #" in out

    # a target that does not answer: named in the manifest, its stored anchor still there;
    # the checkpoint job signs the others and fails naming it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(fleet[2].env, f"postgresql://retention:{SECRET}@127.0.0.1:1/nowhere")
        C.close_all()
        document = manifest(tmp_path / "later.manifest.json")
        out, err = StringIO(), StringIO()
        with pytest.raises(CommandError, match=r"1 target\(s\) not checkpointed"):
            call_command("retention", "audit", "checkpoint", stdout=out, stderr=err)
    shard3 = document["targets"][2]
    assert not shard3["reachable"]
    assert shard3["problem"].startswith("target shard3 is unreachable: ")
    assert shard3["anchor"]["target"] == "shard3"
    assert document["totals"]["unreachable"] == ["shard3"]
    assert "target shard3: not checkpointed: " in err.getvalue()
    signed = json.loads(out.getvalue())["anchors"]
    assert [a.get("target") for a in signed] == [None, "shard1", "shard2"]

    # no password of a connection string in the manifests, the anchors or the messages
    texts = [p.read_text() for p in tmp_path.iterdir()] + [out.getvalue(), err.getvalue()]
    assert len(texts) == 7 and all(SECRET not in text for text in texts)


def test_a_rewrite_of_one_targets_chain_is_caught_naming_that_target(drained, tmp_path):
    checkpoint(tmp_path / "checkpoint.json")
    kept = tmp_path / "period.manifest.json"
    manifest(kept)
    assert verify(kept)[1] == ""

    # shard2's owner edits record 2 and recomputes every later hash: the chain alone verifies
    with C.on("shard2"):
        rewrite_from(2, rows_deleted=0)
    C.close_all()

    # the anchored record (the head when the job ran) no longer has the anchored hash
    with C.on("shard2"):
        head = AuditRecord.objects.order_by("-chain_seq").values_list("chain_seq", flat=True)[0]
    C.close_all()
    out, problems = verify()
    assert f"target shard2: audit record {head} differs from the anchor in checkpoint #" in problems
    assert "target shard1:" not in problems and "target shard3:" not in problems
    assert "target shard1: audit chain intact" in out
    _, problems = verify(kept)
    assert f"target shard2: audit record {head} differs from the anchor in {kept}" in problems
    # the checkpoint job does not sign the rewritten chain (its anchor would bless it): the
    # anchor from before the rewrite stays the latest
    err = StringIO()
    with pytest.raises(CommandError, match=r"1 target\(s\) not checkpointed"):
        call_command("retention", "audit", "checkpoint", stdout=StringIO(), stderr=err)
    assert "target shard2: not checkpointed: its chains contradict checkpoint #" in err.getvalue()
    assert Checkpoint.objects.filter(target="shard2").count() == 1
    assert Checkpoint.objects.filter(target="shard1").count() == 2
    assert "target shard2: audit record" in verify()[1]
    # a manifest made after the rewrite carries the anchor from before it: its proof fails
    later = manifest(tmp_path / "later.manifest.json")["targets"][1]
    assert later["target"] == "shard2"
    assert not later["anchor_extension"]["audit"]["ok"]
    assert "audit record" in later["anchor_extension"]["audit"]["problems"][0]


def test_a_target_without_the_ledger_is_named_in_the_manifest_not_left_out(
    fleet, make_user, act_as, monkeypatch, tmp_path
):
    from targets.models import Target

    bare = fleet[0].server
    database = bare.create_database()
    try:
        with C.on("shard1"):  # the version is validated on its first target
            create_events(50, days=40)
        approved_policy(make_user, **events_spec(targets=["group:shards"]))
        # a member that joins the group later, its ledger not installed
        monkeypatch.setenv("FLEET_TEST_BARE", bare.admin_url(database))
        Target.objects.create(name="bare", dsn_env="FLEET_TEST_BARE", group="shards")
        act_as(make_user("audrey", "auditor"))
        document = manifest(tmp_path / "period.manifest.json")
    finally:
        C.close_all()
        bare.drop_database(database)
    names = [e["target"] for e in document["targets"]]
    assert names == ["bare", "shard1", "shard2", "shard3"]
    entry = document["targets"][0]
    assert not entry["reachable"]
    assert entry["problem"] == "target bare has no ledger (retention target migrate bare)"
    assert document["totals"]["unreachable"] == ["bare"]
    assert all(e["reachable"] and e["runs"] == [] for e in document["targets"][1:])
