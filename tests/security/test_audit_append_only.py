"""Audit rows are append-only in the database (a trigger refuses UPDATE and DELETE on
runs_auditrecord and retention_operatoraction), and the hash chain makes an edit or a gap
made behind the trigger's back visible to ``retention audit verify``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from core.models import OperatorAction
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Run
from tests.runs.conftest import NOW


@pytest.fixture
def audited(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert AuditRecord.objects.count() >= 4
    assert OperatorAction.objects.exists()
    return run


def sqlstate_of(statement: str, params=()) -> str | None:
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, list(params))
    except DatabaseError as exc:
        return getattr(exc.__cause__, "sqlstate", None)
    return None


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE runs_auditrecord SET rows_deleted = rows_deleted + 1",
        "UPDATE runs_auditrecord SET outcome = 'nothing' WHERE chain_seq = 1",
        "DELETE FROM runs_auditrecord WHERE chain_seq = 2",
        "DELETE FROM runs_auditrecord",
        "UPDATE retention_operatoraction SET reason = 'edited'",
        "DELETE FROM retention_operatoraction",
    ],
)
def test_updates_and_deletes_of_audit_rows_are_refused_even_for_the_owner(audited, statement):
    before = (AuditRecord.objects.count(), OperatorAction.objects.count())
    assert sqlstate_of(statement) == "42501"  # insufficient_privilege, from the trigger
    assert (AuditRecord.objects.count(), OperatorAction.objects.count()) == before
    assert verify() == ""


def behind_the_trigger(statement: str, params=()) -> None:
    """What a superuser can still do: switch the trigger off, change rows, switch it on."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending FK checks before ALTER TABLE
        cur.execute("ALTER TABLE runs_auditrecord DISABLE TRIGGER runs_auditrecord_append_only")
        cur.execute(statement, list(params))
        cur.execute("ALTER TABLE runs_auditrecord ENABLE TRIGGER runs_auditrecord_append_only")


def verify() -> str:
    """The problems ``retention audit verify`` reports ('' when the chain is intact)."""
    err = StringIO()
    try:
        call_command("retention", "audit", "verify", stdout=StringIO(), stderr=err)
    except CommandError as exc:
        assert "audit chain broken" in str(exc)
        return err.getvalue() or str(exc)
    return ""


def test_an_edited_row_is_reported_by_audit_verify(audited):
    behind_the_trigger("UPDATE runs_auditrecord SET rows_deleted = 0 WHERE chain_seq = 2")
    assert "record 2: content does not match its hash" in verify()


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(audited):
    from runs.evidence.audit import record_hash

    fields = [f for f in AuditRecord._meta.get_fields() if hasattr(f, "attname")]
    row = AuditRecord.objects.filter(chain_seq=2).values(*(f.attname for f in fields)).get()
    row["rows_deleted"] = 0
    forged = record_hash(row, row["prev_hash"])
    behind_the_trigger(
        "UPDATE runs_auditrecord SET rows_deleted = 0, hash = %s WHERE chain_seq = 2", [forged]
    )
    assert "record 3: previous hash does not match" in verify()


def test_a_deleted_row_is_reported_as_a_gap(audited):
    behind_the_trigger("DELETE FROM runs_auditrecord WHERE chain_seq = 2")
    report = verify()
    assert "gap: expected record 2, found 3" in report


def test_a_deleted_tail_is_caught_by_audit_verify_and_the_invariant_checker(audited):
    """A chain cannot show that its newest records were removed (the rest still links up);
    the chunk ledger can: a finished chunk without its audit row."""
    last = AuditRecord.objects.order_by("-chain_seq").values_list("chain_seq", flat=True)[0]
    behind_the_trigger("DELETE FROM runs_auditrecord WHERE chain_seq = %s", [last])
    assert "1 finished chunk(s) have no audit record" in verify()
    problems = check_run(audited, shadow=("public", "rr_events_shadow"))
    assert "1 finished chunk(s) without an audit row" in problems
    assert any("gone but" in p for p in problems)
