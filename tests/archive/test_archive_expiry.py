"""``[archive] keep_years``: the reconciler removes a run's archive objects once its cutoff is
that many years old, each named with its digest in an audit record, none under an open hold."""

from __future__ import annotations

from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from django.db import transaction

from core.oplog import ActionError
from retention.actions import approve_hold_release, place_hold, request_hold_release
from runs import archive_expiry
from runs.actions import trigger_run
from runs.engine import reconciler, worker
from runs.evidence import archives, audit
from runs.models import AuditRecord, Run
from runs.restores import approve_restore, carry_out, request_restore
from tests.archive.conftest import create_typed, typed_spec
from tests.factories import approved_policy
from tests.runs.conftest import NOW


def _drained(make_user, archive_dir, keep_years=1):
    create_typed()
    policy = approved_policy(make_user, **typed_spec(archive_dir, keep_years=keep_years))
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return policy, run


def _tenants(path) -> set[int]:
    return set(pq.read_table(path, columns=["tenant_id"]).column(0).to_pylist())


def test_objects_past_keep_years_are_removed_with_their_digests_on_the_chain_and_held_ones_stay(
    db, make_user, archive_dir, no_guard, django_capture_on_commit_callbacks
):
    policy, run = _drained(make_user, archive_dir)
    written = archives.run_objects(run.pk)
    assert len(written) > 2
    due = archive_expiry.expiry_of(run.cutoff, 1)
    assert due == run.cutoff.replace(year=run.cutoff.year + 1)

    # a day before the cutoff is a year old: nothing goes
    with django_capture_on_commit_callbacks(execute=True):
        report = reconciler.reconcile(now=due - timedelta(days=1))
    assert report["archive_expired"] == []
    assert all((archive_dir / o["name"]).is_file() for o in written)

    # a hold placed after the run on tenant 2 keeps the objects holding its rows
    officer = make_user("carol", "compliance")
    hold = place_hold(actor=officer, reason="litigation", policy=policy, tenant="2")
    held = {o["name"] for o in written if 2 in _tenants(archive_dir / o["name"])}
    assert held and len(held) < len(written)
    with django_capture_on_commit_callbacks(execute=True):
        report = reconciler.reconcile(now=due + timedelta(days=1))
    assert f"run {run.run_key}: {len(written) - len(held)} archive object(s) expired" in " ".join(
        report["archive_expired"]
    )
    left = {str(p.relative_to(archive_dir)) for p in archive_dir.rglob("*.parquet")}
    assert left == held
    (record,) = AuditRecord.objects.filter(run=run, outcome="expired")
    assert record.chain_version == audit.ARCHIVE_CHAIN_VERSION
    assert record.archive["keep_years"] == 1
    chain = {o["name"]: o["sha256"] for o in written}
    named = {o["name"]: o["sha256"] for o in record.archive["objects"]}
    assert named == {k: v for k, v in chain.items() if k not in held}
    assert audit.verify_chain().ok
    checked, problems = archives.verify_objects()
    assert (checked, problems) == (len(held), [])

    # released by two officers: the next pass expires the rest, in a record of its own
    request_hold_release(hold, actor=officer, reason="settled")
    approve_hold_release(hold, actor=make_user("dave", "compliance"), reason="settled")
    with django_capture_on_commit_callbacks(execute=True):
        reconciler.reconcile(now=due + timedelta(days=2))
    assert list(archive_dir.rglob("*.parquet")) == []
    records = AuditRecord.objects.filter(run=run, outcome="expired").order_by("chain_seq")
    assert [len(r.archive["objects"]) for r in records] == [len(written) - len(held), len(held)]
    assert archives.expired_names(run.pk) == set(chain)
    assert archives.verify_objects() == (0, [])
    assert audit.verify_chain().ok

    # nothing more to expire: a further pass writes no record
    with django_capture_on_commit_callbacks(execute=True):
        reconciler.reconcile(now=due + timedelta(days=3))
    assert AuditRecord.objects.filter(run=run, outcome="expired").count() == 2


def test_a_policy_without_keep_years_keeps_its_archive(
    db, make_user, archive_dir, no_guard, django_capture_on_commit_callbacks
):
    create_typed()
    policy = approved_policy(make_user, **typed_spec(archive_dir))
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    files = sorted(archive_dir.rglob("*.parquet"))
    assert files
    with django_capture_on_commit_callbacks(execute=True):
        report = reconciler.reconcile(now=NOW + timedelta(days=365 * 50))
    assert report["archive_expired"] == []
    assert sorted(archive_dir.rglob("*.parquet")) == files
    assert not AuditRecord.objects.filter(outcome="expired").exists()


def test_files_of_a_pass_stopped_before_removing_them_go_with_the_orphans_and_are_not_restored(
    db, make_user, archive_dir, no_guard
):
    policy, run = _drained(make_user, archive_dir)
    written = sorted(o["name"] for o in archives.run_objects(run.pk))
    due = archive_expiry.expiry_of(run.cutoff, 1) + timedelta(days=1)
    with transaction.atomic():  # its record commits; the files' removal never comes
        lines = archive_expiry.expire_archives(policy, now=due)
    assert len(lines) == 1
    assert (
        sorted(str(p.relative_to(archive_dir)) for p in archive_dir.rglob("*.parquet")) == written
    )
    assert sorted(reconciler.remove_archive_orphans(policy)) == written
    assert list(archive_dir.rglob("*.parquet")) == []
    assert archive_expiry.expire_archives(policy, now=due) == []  # no second record
    assert AuditRecord.objects.filter(run=run, outcome="expired").count() == 1

    request = request_restore(run, actor=make_user("erin", "compliance"), reason="mistake")
    approve_restore(request, actor=make_user("frank", "compliance"), reason="confirmed")
    with pytest.raises(ActionError, match="was removed under \\[archive\\] keep_years"):
        carry_out(request)
