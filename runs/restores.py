"""Restoring a run's archived rows (docs/runbook.md, "Restoring rows").

Like a hold's release: one member of compliance requests (``request_restore``), another
approves (``approve_restore``; never the requester — the database refuses it too:
``restorerequest_four_eyes``), each with its operator-log row in the same transaction and
refused after the version's ``[archive] restore_days``. Then ``carry_out`` re-inserts, object
by object, each in its own transaction, the archived rows in scope that are not in the table
again, and appends an audit record for each object (outcome "restored", chain version 8,
``archive`` naming the restore, the object, its digest and the rows put back) — so the chain
shows both directions. A restore interrupted part way is carried on by ``carry_out`` again:
the objects already restored have their record and are skipped.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from archive import objects
from archive import restore as archive_restore
from core.oplog import ActionError, NeedsAnotherPerson, record_action, require_reason
from core.roles import COMPLIANCE, check_role
from runs.evidence import archives
from runs.models import AuditRecord, RestoreRequest, Run


def window_end(run: Run) -> datetime | None:
    """Until when the run's archived rows may be restored: its last archive record's commit
    plus the version's ``restore_days``; None when the run archived nothing."""
    last = (
        AuditRecord.objects.filter(run=run, archive__isnull=False, outcome="deleted")
        .order_by("-chain_seq")
        .values_list("committed_at", flat=True)
        .first()
    )
    if last is None:
        return None
    return last + timedelta(days=run.policy_version.parsed.restore_days)


def _check_window(run: Run, now: datetime) -> None:
    end = window_end(run)
    if end is None:
        raise ActionError(f"run {run.run_key} archived no rows: there is nothing to restore")
    if now > end:
        days = run.policy_version.parsed.restore_days
        raise ActionError(
            f"run {run.run_key}'s archived rows could be restored until {end:%Y-%m-%d %H:%M} UTC"
            f" ([archive] restore_days = {days}); the window has passed"
        )


@transaction.atomic
def request_restore(
    run: Run,
    *,
    actor,
    reason: str,
    tenant: str | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> RestoreRequest:
    """Ask for a run's archived rows (one tenant's, a time range's, or all) to be put back."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "requesting a restore")
    run = Run.objects.select_for_update().select_related("policy_version").get(pk=run.pk)
    spec = run.policy_version.parsed
    if tenant and len(spec.tenant_columns) != 1:
        raise ActionError(
            f"--tenant restores a policy whose tenant is one column; {spec.slug}'s tenant is "
            f"{spec.tenant_label or 'not set'}"
        )
    if time_from and time_to and time_from >= time_to:
        raise ActionError("--from must be before --to")
    _check_window(run, timezone.now())
    request = RestoreRequest.objects.create(
        run=run,
        tenant=tenant or "",
        time_from=time_from,
        time_to=time_to,
        requested_by=actor.username,
        request_reason=reason,
    )
    record_action(
        actor, "restore.request", request, reason=reason, run=run.run_key,
        scope=request.scope(), archived_rows=archives.archived_rows(run.pk),
    )  # fmt: skip
    return request


def _locked(request: RestoreRequest) -> RestoreRequest:
    return (
        RestoreRequest.objects.select_for_update(of=("self",))
        .select_related("run", "run__policy_version")
        .get(pk=request.pk)
    )


@transaction.atomic
def approve_restore(request: RestoreRequest, *, actor, reason: str) -> RestoreRequest:
    """Approve a restore another member of compliance requested; ``carry_out`` then does it."""
    check_role(actor, COMPLIANCE)
    reason = require_reason(reason, "approving a restore")
    request = _locked(request)
    if request.state != RestoreRequest.State.REQUESTED:
        raise ActionError(f"restore #{request.pk} was already approved by {request.approved_by}")
    if request.requested_by == actor.username:
        raise NeedsAnotherPerson(
            f"{actor.username} requested restore #{request.pk} and cannot approve it; another "
            "member of compliance must"
        )
    _check_window(request.run, timezone.now())
    request.state = RestoreRequest.State.APPROVED
    request.approved_by = actor.username
    request.approved_at = timezone.now()
    request.approval_reason = reason
    request.save(update_fields=["state", "approved_by", "approved_at", "approval_reason"])
    record_action(
        actor, "restore.approve", request, reason=reason, run=request.run.run_key,
        scope=request.scope(), requested_by=request.requested_by,
        request_reason=request.request_reason,
    )  # fmt: skip
    return request


def _restored_names(request: RestoreRequest) -> set[str]:
    records = AuditRecord.objects.filter(
        run_id=request.run_id, outcome="restored", archive__restore=request.pk
    ).values_list("archive", flat=True)
    return {o["name"] for archive in records for o in archive.get("objects", [])}


def carry_out(request: RestoreRequest) -> int:
    """Restore an approved request's rows, object by object (each object its own transaction
    and audit record); the rows put back. Objects already restored are skipped."""
    request = RestoreRequest.objects.select_related("run", "run__policy_version").get(pk=request.pk)
    if request.state == RestoreRequest.State.REQUESTED:
        raise ActionError(f"restore #{request.pk} waits for another member of compliance")
    run = request.run
    spec = run.policy_version.parsed
    done = _restored_names(request)
    total = 0
    for item in archives.run_objects(run.pk):
        if item["name"] in done:
            continue
        total += _restore_one(request, run, spec, item)
    with transaction.atomic():
        restored = sum(
            o.get("rows_restored", 0)
            for a in AuditRecord.objects.filter(
                run=run, outcome="restored", archive__restore=request.pk
            ).values_list("archive", flat=True)
            for o in a.get("objects", [])
        )
        RestoreRequest.objects.filter(pk=request.pk).update(
            state=RestoreRequest.State.DONE, finished_at=timezone.now()
        )
        # the product's own process puts the rows back: a system actor, not a person
        record_action("worker", "restore.done", request, run=run.run_key, rows_restored=restored)
    return total


def _restore_one(request: RestoreRequest, run: Run, spec, item: dict) -> int:
    scope = dict(
        tenant=request.tenant or None, time_from=request.time_from, time_to=request.time_to
    )
    if archives.in_table(item):  # a chunk's rows in an archive table of another database
        problem = archives.table_object_problem(run, spec, item)
        if problem:
            raise ActionError(f"{problem}; nothing restored from it")
        started = timezone.now()
        with transaction.atomic():
            inserted = archive_restore.restore_from_table(
                connection, spec, archives.table_object_scope(run, spec, item), **scope
            )
            _record_restore(request, run, spec, item, inserted, started)
        return inserted
    if item["name"] in archives.expired_names(run.pk):
        raise ActionError(
            f"archive object {item['name']} was removed under [archive] keep_years (its audit"
            " record names it); nothing restored from it"
        )
    path = archives.object_path(item["to"], item["name"])
    if objects.file_sha256(path) != item["sha256"]:
        raise ActionError(
            f"archive object {item['name']} does not match the SHA-256 its audit record holds;"
            " nothing restored from it (retention audit verify --archives)"
        )
    started = timezone.now()
    with transaction.atomic():
        inserted = archive_restore.restore_object(connection, spec, path, **scope)
        _record_restore(request, run, spec, item, inserted, started)
    return inserted


def _record_restore(request: RestoreRequest, run: Run, spec, item: dict, inserted: int, started):
    """The restore's audit record of one object, in the caller's transaction."""
    archives.append_object_record(
        run,
        run.policy_version,
        spec,
        table=item["table"],
        tenant=request.tenant,
        outcome="restored",
        started_at=started,
        archive={
            "to": item["to"],
            "restore": request.pk,
            "requested_by": request.requested_by,
            "approved_by": request.approved_by,
            "objects": [{**archives.object_facts(item), "rows_restored": inserted}],
        },
    )
