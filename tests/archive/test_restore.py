"""Restoring archived rows: requested by one compliance officer, approved by another, put back
object by object with restore records on the same chain; refused after the window."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.models import OperatorAction
from runs import restores
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import audit
from runs.models import AuditRecord, RestoreRequest, Run
from tests.runs.conftest import NOW

COLUMNS = (
    "id, tenant_id, occurred_at, status, amount, exact::text, small, ratio, flag, day, local_at,"
    " doc::text, js::text, raw, tags, nums, prices, ref, span::text"
)


def _rows(where: str = "TRUE") -> dict:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {COLUMNS} FROM public.rr_typed WHERE {where} ORDER BY id")  # noqa: S608
        return {r[0]: r for r in cur.fetchall()}


def cli(*args) -> str:
    out = StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def drained(typed_policy, no_guard):
    snapshot = _rows()
    run, _ = trigger_run(typed_policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run, snapshot


def test_one_tenants_rows_come_back_after_a_second_approval(drained, make_user, act_as):
    run, snapshot = drained
    alice, carol = make_user("alice", "compliance"), make_user("carol", "compliance")
    deleted_2 = {k for k, r in snapshot.items() if r[1] == 2} - set(_rows("tenant_id = 2"))
    assert len(deleted_2) > 20
    others_before = _rows("tenant_id <> 2")

    act_as(alice)
    out = cli("restore", run.run_key, "--tenant", "2", "--reason", "deleted by mistake")
    request = RestoreRequest.objects.get()
    assert out.startswith(f"restore #{request.pk} requested by alice: tenant 2 of {run.run_key}")
    assert _rows("tenant_id = 2") != {k: v for k, v in snapshot.items() if v[1] == 2}

    with pytest.raises(CommandError, match="alice requested restore #.* and cannot approve it"):
        cli("restore", "approve", str(request.pk), "--reason", "me too")
    with pytest.raises(IntegrityError), transaction.atomic():  # the database refuses it too
        RestoreRequest.objects.filter(pk=request.pk).update(approved_by="alice")

    act_as(carol)
    out = cli("restore", "approve", str(request.pk), "--reason", "confirmed with the tenant")
    assert f"restore #{request.pk} approved by carol (requested by alice)" in out
    assert f"{len(deleted_2)} row(s) put back" in out

    # tenant 2's rows are exactly as they were; the others' stay deleted
    assert _rows("tenant_id = 2") == {k: v for k, v in snapshot.items() if v[1] == 2}
    assert _rows("tenant_id <> 2") == others_before

    # the chain shows both directions and verifies
    restored = AuditRecord.objects.filter(run=run, outcome="restored")
    assert restored.exists()
    assert sum(o["rows_restored"] for r in restored for o in r.archive["objects"]) == len(deleted_2)
    assert all(r.chain_version == audit.ARCHIVE_CHAIN_VERSION for r in restored)
    assert all(r.archive["restore"] == request.pk for r in restored)
    assert AuditRecord.objects.filter(run=run, outcome="deleted").count() >= 3
    assert cli("audit", "verify", "--archives").startswith("audit chain intact")
    assert list(
        OperatorAction.objects.filter(target_type="restorerequest")
        .order_by("chain_seq")
        .values_list("action", "actor")
    ) == [
        ("restore.request", "alice"),
        ("restore.approve", "carol"),
        ("restore.done", "worker"),
    ]
    request.refresh_from_db()
    assert request.state == RestoreRequest.State.DONE

    # carried on again: every object has its restore record, nothing happens twice
    records = restored.count()
    assert "0 row(s) put back" in cli("restore", "resume", str(request.pk))
    assert AuditRecord.objects.filter(run=run, outcome="restored").count() == records


def test_a_restore_past_the_window_is_refused_with_one_line(
    drained, make_user, act_as, monkeypatch
):
    run, _ = drained
    alice = make_user("alice", "compliance")
    act_as(alice)
    end = restores.window_end(run)
    assert end is not None and end - timezone.now() > timedelta(days=29)
    monkeypatch.setattr(restores.timezone, "now", lambda: end + timedelta(seconds=1))
    with pytest.raises(CommandError) as refused:
        cli("restore", run.run_key, "--reason", "too late")
    assert str(refused.value) == (
        f"run {run.run_key}'s archived rows could be restored until {end:%Y-%m-%d %H:%M} UTC"
        " ([archive] restore_days = 30); the window has passed"
    )
    assert not RestoreRequest.objects.exists()


def test_a_tampered_object_is_not_restored(drained, make_user, archive_dir):
    run, _ = drained
    alice, carol = make_user("alice", "compliance"), make_user("carol", "compliance")
    request = restores.request_restore(run, actor=alice, reason="needed")
    restores.approve_restore(request, actor=carol, reason="ok")
    first = AuditRecord.objects.filter(run=run, outcome="deleted").order_by("chain_seq").first()
    victim = archive_dir / first.archive["objects"][0]["name"]
    victim.write_bytes(victim.read_bytes()[:-8] + b"tampered")
    with pytest.raises(Exception, match="does not match the SHA-256 its audit record holds"):
        restores.carry_out(request)
    assert not AuditRecord.objects.filter(outcome="restored").exists()
