"""Tampering by the database owner is detectable: the chain covers every field an auditor
relies on, the operator log is chained too, a removed tail is reported, and a rewrite that
recomputes every later hash is caught against a signed anchor (a run's manifest or a
checkpoint) kept outside the database. Anchors are signed only by the checkpoint job, never
on demand: a manifest carries the latest stored checkpoint and the proof that the chain
extends it."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse

from core.models import OperatorAction
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import anchors as evidence
from runs.evidence import audit, exports
from runs.models import AuditRecord, Checkpoint, Chunk, Run
from tests.runs.conftest import NOW

pytestmark = pytest.mark.usefixtures("no_guard")

KEY = "evidence-key-kept-off-the-database-host-0123456789"


@pytest.fixture
def audited(events_policy, settings):
    settings.RETENTION_EVIDENCE_KEY = KEY.encode()
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert AuditRecord.objects.count() >= 5
    return run


def verify(*against) -> str:
    """The problems ``retention audit verify [--against ...]`` reports ('' when intact)."""
    err = StringIO()
    args = ["--against", *map(str, against)] if against else []
    try:
        call_command("retention", "audit", "verify", *args, stdout=StringIO(), stderr=err)
    except CommandError as exc:
        return err.getvalue() + str(exc)
    return ""


def save_manifest(run, path) -> str:
    path.write_text("".join(exports.manifest_json(run)))
    return str(path)


def save_checkpoint(path) -> str:
    call_command("retention", "audit", "checkpoint", "--out", str(path), stdout=StringIO())
    return str(path)


def as_owner(*statements: tuple[str, list]) -> None:
    """What the table owner can do: switch the append-only triggers off, change rows, on."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table in ("runs_auditrecord", "retention_operatoraction"):
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        for statement, params in statements:
            cur.execute(statement, params)
        for table in ("runs_auditrecord", "retention_operatoraction"):
            cur.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def rewrite_from(seq: int, **changes) -> None:
    """Edit record ``seq`` and recompute its hash and every later link, as an owner who
    knows the algorithm would."""
    fields = [f.attname for f in AuditRecord._meta.concrete_fields]
    rows = list(
        AuditRecord.objects.filter(chain_seq__gte=seq).order_by("chain_seq").values(*fields)
    )
    prev = rows[0]["prev_hash"]
    statements = []
    for row in rows:
        if row["chain_seq"] == seq:
            row.update(changes)
        row["prev_hash"] = prev
        row["hash"] = audit.record_hash(row, prev)
        prev = row["hash"]
        sets = ", ".join(f"{name} = %s" for name in [*changes, "prev_hash", "hash"])
        statements.append(
            (
                f"UPDATE runs_auditrecord SET {sets} WHERE chain_seq = %s",  # noqa: S608
                [*(row[name] for name in changes), row["prev_hash"], row["hash"], row["chain_seq"]],
            )
        )
    as_owner(*statements)


def test_a_full_rewrite_verifies_alone_but_not_against_a_manifest_kept_outside(audited, tmp_path):
    save_checkpoint(tmp_path / "checkpoint.json")  # the checkpoint job ran
    manifest = save_manifest(audited, tmp_path / "manifest.json")
    assert verify(manifest) == ""

    rewrite_from(3, rows_deleted=0)

    assert verify() == ""  # self-consistent: the chain alone cannot tell
    report = verify(manifest)
    assert "audit record" in report and "differs from the anchor in" in report
    assert "manifest.json" in report


def test_a_removed_tail_is_reported_by_audit_verify(audited):
    last = AuditRecord.objects.order_by("-chain_seq").values_list("chain_seq", flat=True)[0]
    as_owner(("DELETE FROM runs_auditrecord WHERE chain_seq = %s", [last]))
    assert "1 finished chunk(s) have no audit record" in verify()


def test_a_removed_tail_with_its_chunks_is_caught_against_a_checkpoint(audited, tmp_path):
    checkpoint = save_checkpoint(tmp_path / "checkpoint.json")
    last = AuditRecord.objects.order_by("-chain_seq").values("chain_seq", "chunk_id")[0]
    as_owner(("DELETE FROM runs_auditrecord WHERE chain_seq = %s", [last["chain_seq"]]))
    Chunk.objects.filter(pk=last["chunk_id"]).delete()

    assert verify() == ""
    assert f"the audit chain ends at record {last['chain_seq'] - 1}" in verify(checkpoint)


def test_the_operator_log_is_chained(audited):
    ids = list(OperatorAction.objects.order_by("chain_seq").values_list("chain_seq", flat=True))
    assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 2
    as_owner(("UPDATE retention_operatoraction SET actor = 'mallory' WHERE chain_seq = 1", []))
    assert "operator action 1: content does not match its hash" in verify()


def test_a_removed_operator_action_is_a_gap(audited):
    as_owner(("DELETE FROM retention_operatoraction WHERE chain_seq = 1", []))
    assert "operator log gap: expected operator action 1, found 2" in verify()


def test_a_forged_anchor_is_refused(audited, tmp_path):
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path)
    anchor = json.loads(path.read_text())
    rewrite_from(2, rows_deleted=0)
    anchor["audit"]["hash"] = AuditRecord.objects.get(chain_seq=anchor["audit"]["seq"]).hash
    path.write_text(json.dumps(anchor))
    assert "signature does not match" in verify(path)


def test_an_anchor_needs_the_evidence_key(audited, tmp_path, settings):
    checkpoint = save_checkpoint(tmp_path / "checkpoint.json")
    settings.RETENTION_EVIDENCE_KEY = b"another-key-entirely-another-key-entirely"
    assert "signature does not match" in verify(checkpoint)


def test_records_of_chain_version_1_still_verify_and_cannot_follow_version_2(audited):
    """Records written before the fields were added keep their version-1 hash."""
    first = AuditRecord.objects.filter(chain_seq=1).values(*audit.V1_FIELDS, "prev_hash").get()
    v1 = audit.record_hash({**first, "chain_version": 1}, first["prev_hash"])
    rows = list(AuditRecord.objects.order_by("chain_seq").values(
        *[f.attname for f in AuditRecord._meta.concrete_fields]))  # fmt: skip
    statements = [  # a version 1 record has none of version 2's fields
        ("UPDATE runs_auditrecord SET chain_version = 1, hash = %s, run_key = '',"
         " version_hash = '', approval_reason = '', version_number = NULL, author_id = NULL,"
         " submitted_by_id = NULL, approved_by_id = NULL, approved_at = NULL"
         " WHERE chain_seq = 1", [v1])
    ]  # fmt: skip
    prev = v1
    for row in rows[1:]:
        row["prev_hash"] = prev
        row["hash"] = prev = audit.record_hash(row, prev)
        statements.append(
            ("UPDATE runs_auditrecord SET prev_hash = %s, hash = %s WHERE chain_seq = %s",
             [row["prev_hash"], row["hash"], row["chain_seq"]])
        )  # fmt: skip
    as_owner(*statements)
    assert verify() == ""

    as_owner(("UPDATE runs_auditrecord SET chain_version = 1 WHERE chain_seq = 3", []))
    assert "record 3: chain version 1 after version 2" in verify()


@pytest.mark.django_db(transaction=True)
def test_operator_actions_from_before_the_chain_are_chained_by_the_migration():
    from django.db.migrations.executor import MigrationExecutor

    from core.oplog import verify_operator_log

    before = [("retention", "0002_policyversion_submitted_by")]
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()  # every app's, as before
    MigrationExecutor(connection).migrate(before)
    try:
        with connection.cursor() as cur:
            for n, details in enumerate(['{"chunks": 3}', '{"x": 1.50, "y": [1, 2]}', "{}"]):
                cur.execute(
                    "INSERT INTO retention_operatoraction"
                    " (at, actor, action, target_type, target_id, reason, details)"
                    " VALUES (now(), 'alice', 'run.pause', 'run', %s, 'old row', %s)",
                    [str(n), details],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)
    report = verify_operator_log()
    assert report.ok, report.problems
    assert report.records == 3
    assert list(OperatorAction.objects.order_by("id").values_list("chain_seq", flat=True)) == [
        1,
        2,
        3,
    ]


def test_a_checkpoint_without_the_evidence_key_is_refused(db, settings, tmp_path):
    settings.RETENTION_EVIDENCE_KEY = None
    with pytest.raises(CommandError, match="RETENTION_EVIDENCE_KEY is not set"):
        save_checkpoint(tmp_path / "checkpoint.json")
    assert not (tmp_path / "checkpoint.json").exists()


def download_manifest(client, run, auditor) -> dict:
    client.force_login(auditor)
    response = client.get(reverse("runs:manifest", args=[run.pk]))
    assert response.status_code == 200
    return json.loads(b"".join(response.streaming_content))


def test_a_manifest_downloaded_after_a_rewrite_does_not_vouch_for_it(
    audited, tmp_path, client, make_user
):
    """The owner rewrites a record (every later hash recomputed), then any auditor session
    downloads a manifest: it carries the checkpoint from before the rewrite, signed by the
    checkpoint job, not a fresh signature of the rewritten heads."""
    save_checkpoint(tmp_path / "checkpoint.json")
    rewrite_from(3, rows_deleted=0)

    document = download_manifest(client, audited, make_user("audrey", "auditor"))

    path = tmp_path / "after-rewrite.manifest.json"
    path.write_text(json.dumps(document))
    assert "audit record" in verify(path) and "differs from the anchor" in verify(path)
    assert document["anchor_extension"]["audit"]["ok"] is False
    assert "no longer has the anchored hash" in document["anchor_extension"]["audit"]["problems"][0]


def test_a_manifest_carries_the_latest_checkpoint_and_the_proof_the_chain_extends_it(
    audited, tmp_path, client, make_user, events_policy, settings
):
    save_checkpoint(tmp_path / "first.json")
    checkpoint = Checkpoint.objects.get()
    later, _ = trigger_run(events_policy, tick=NOW + timedelta(days=2))
    worker.drain(later.pk, budget_s=60, until_idle=True)
    head = AuditRecord.objects.order_by("-chain_seq").first()
    # the web process holds no key, only its public half
    settings.RETENTION_EVIDENCE_PUBLIC_KEY = bytes.fromhex(evidence.public_key_hex())
    settings.RETENTION_EVIDENCE_KEY = None

    document = download_manifest(client, audited, make_user("audrey", "auditor"))

    assert document["anchor"]["audit"] == {
        "seq": checkpoint.audit_seq,
        "hash": checkpoint.audit_hash,
    }
    assert document["anchor"]["signature"] == checkpoint.signature
    proof = document["anchor_extension"]["audit"]
    assert (proof["from_seq"], proof["to_seq"], proof["to_hash"]) == (
        checkpoint.audit_seq,
        head.chain_seq,
        head.hash,
    )
    assert proof["records"] == head.chain_seq - checkpoint.audit_seq > 0
    assert proof["ok"] and document["anchor_extension"]["operator"]["ok"]
    assert f"signed checkpoint #{checkpoint.pk}" in document["anchor_status"]

    # a record after the checkpoint edited behind the trigger breaks the proof
    as_owner(
        ("UPDATE runs_auditrecord SET rows_deleted = 7 WHERE chain_seq = %s", [head.chain_seq])
    )
    document = download_manifest(client, audited, make_user("olivia", "auditor"))
    assert document["anchor_extension"]["audit"]["ok"] is False
    assert (
        f"record {head.chain_seq}: content does not match its hash"
        in (document["anchor_extension"]["audit"]["problems"])
    )


def test_without_a_signed_checkpoint_the_manifest_and_the_run_page_say_so(
    audited, tmp_path, client, make_user
):
    auditor = make_user("audrey", "auditor")
    document = download_manifest(client, audited, auditor)
    assert document["anchor"] is None and document["anchor_extension"] is None
    assert document["anchor_status"].startswith("No signed checkpoint yet")

    page = client.get(reverse("runs:detail", args=[audited.pk])).content.decode()
    assert "No signed checkpoint yet" in page

    path = tmp_path / "unanchored.manifest.json"
    path.write_text(json.dumps(document))
    assert "holds no signed checkpoint" in verify(path)


def test_a_checkpoint_is_stored_signed_and_verifies(audited, tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.json")
    stored = Checkpoint.objects.get()
    head = AuditRecord.objects.order_by("-chain_seq").first()
    assert (stored.audit_seq, stored.audit_hash) == (head.chain_seq, head.hash)
    assert json.loads(Path(path).read_text())["signature"] == stored.signature
    assert verify(path) == ""
