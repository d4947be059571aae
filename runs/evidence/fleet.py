"""The evidence manifest of a policy and period over every target (docs/fleet.md, "Evidence").

One document for what a policy did in one period wherever it ran: the approved version (from
the control database), then per target — each target the policy's approved version names, its
groups read now — the period's run(s) there with their rows deleted (``runs.progress``, as
every surface reads them) and their records re-hashed, the head of the target's audit chain and
operator log, and the target's latest signed checkpoint with the proof that its chains extend
it up to that head. A target that does not answer is an entry saying so ("target NAME is
unreachable: …"), with its latest checkpoint still (that lives in the control database):
never silently missing.

Nothing is signed here, as in a run manifest: each anchor is the checkpoint job's
(``runs.evidence.anchors``), so downloading a manifest after a rewrite yields no anchor for it,
and ``retention audit verify --against`` the file checks every target's chain against the
anchor the file carries.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.http import JsonResponse
from django.utils import timezone

from core.models import OperatorAction
from retention.models import Policy
from runs.evidence import anchors
from runs.evidence.exports import anchor_evidence, file_stem, rehash_run_records
from runs.models import AuditRecord, Run
from runs.progress import BrokerBacklog, progress_for
from targets import connections as C
from targets.models import DEFAULT

FORMAT = "retention-runner period evidence"
NO_QUEUE = BrokerBacklog(waiting=0, oldest_age_s=None)  # the queue is not evidence


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def _head(model) -> dict:
    row = model.objects.order_by("-chain_seq").values("chain_seq", "hash").first()
    return {"seq": row["chain_seq"], "hash": row["hash"]} if row else {"seq": 0, "hash": None}


def _runs_here(policy_id: int, tick: datetime) -> list[dict]:
    """The period's runs of the policy in the database in place, each with its evidence."""
    runs = list(
        Run.objects.filter(policy_id=policy_id, tick=tick)
        .select_related("policy", "policy_version")
        .order_by("id")
    )
    progress = progress_for(runs, now=timezone.now(), broker=NO_QUEUE, remembered=False)
    out = []
    for run in runs:
        p = progress[run.pk]
        last = run.audit_records.order_by("-chain_seq").values("chain_seq", "hash").first()
        first = run.audit_records.order_by("chain_seq").values_list("chain_seq", flat=True).first()
        out.append(
            {
                "run_key": run.run_key,
                "id": run.pk,
                "state": run.state,
                "state_reason": run.state_reason,
                "source": run.source,
                "cutoff": _iso(run.cutoff),
                "rollout": run.rollout,
                "policy_version": run.policy_version.number,
                "version_hash": run.policy_version.approved_hash or run.policy_version.content_hash,
                "started_at": _iso(run.started_at),
                "finished_at": _iso(run.finished_at),
                "rows_deleted": p.rows_deleted,
                "audit_records": p.audit_records,
                "run_first_seq": first,
                "run_last_seq": last["chain_seq"] if last else None,
                "run_last_hash": last["hash"] if last else None,
                "run_records": rehash_run_records(run),
                "verification": run.verification,
            }
        )
    return out


def _target_entry(name: str, policy_id: int, tick: datetime) -> dict:
    """One target's part: its runs, chains' heads and anchor; or why it could not be read."""
    stored_as = "" if name == DEFAULT else name  # the control database's own: ''
    checkpoint = anchors.latest_checkpoint(stored_as)  # in the control database, read first
    anchor = {
        "anchor": anchors.document(checkpoint) if checkpoint else None,
        "anchor_status": anchors.status(checkpoint, target=stored_as),
    }
    try:
        with C.on(name), transaction.atomic():
            with connection.cursor() as cur:  # one snapshot: runs, heads and the proof agree
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if not C.has_ledger():
                return {
                    "target": name,
                    "reachable": False,
                    "problem": f"target {name} has no ledger (retention target migrate {name})",
                    **anchor,
                }
            runs = _runs_here(policy_id, tick)
            heads = {"audit": _head(AuditRecord), "operator": _head(OperatorAction)}
            extension = anchors.extension(checkpoint) if checkpoint else None
    except Exception as exc:  # noqa: BLE001 - a target that does not answer: one line, named
        C.close_all()
        if not isinstance(exc, C.TargetError):
            C.note_reachable(name, exc)
        why = C.first_line(exc).removeprefix(f"target {name}: ")
        return {
            "target": name,
            "reachable": False,
            "problem": f"target {name} is unreachable: {why}",
            **anchor,
        }
    C.note_reachable(name, None)
    return {
        "target": name,
        "reachable": True,
        "runs": runs,
        "note": "" if runs else "no run for this period on this target",
        "rows_deleted": sum(r["rows_deleted"] for r in runs),
        "audit_chain": {
            "head_seq": heads["audit"]["seq"],
            "head_hash": heads["audit"]["hash"],
            "operator_head_seq": heads["operator"]["seq"],
            "operator_head_hash": heads["operator"]["hash"],
        },
        **anchor,
        "anchor_extension": extension,
    }


def period_manifest(policy: Policy, tick: datetime) -> dict:
    """The manifest of ``policy``'s period ``tick`` over every target of its approved version
    (read on the control database, which it must be called on)."""
    version = policy.approved_version
    names = C.targets_of(policy)
    entries = []
    for name in names:
        try:
            entries.append(_target_entry(name, policy.pk, tick))
        finally:
            if name != DEFAULT:
                C.close_all()
    reachable = [e for e in entries if e["reachable"]]
    return {
        "manifest": FORMAT,
        "format": 1,
        "generated_at": _iso(timezone.now()),
        "policy": {"slug": policy.slug, "name": policy.name},
        "period": {"tick": _iso(tick)},
        "approved_version": (
            {
                "number": version.number,
                "content_hash": version.approved_hash or version.content_hash,
                "author": version.author.username,
                "approver": version.decided_by.username if version.decided_by else None,
                "approved_at": _iso(version.decided_at),
                "targets": list(version.parsed.targets),
            }
            if version
            else None
        ),
        "totals": {
            "targets": len(entries),
            "targets_read": len(reachable),
            "unreachable": [e["target"] for e in entries if not e["reachable"]],
            "runs": sum(len(e["runs"]) for e in reachable),
            "rows_deleted": sum(e["rows_deleted"] for e in reachable),
        },
        # the control database's own chains (its operator log holds the approval and holds)
        "control": anchor_evidence(),
        "targets": entries,
    }


def manifest_response(policy: Policy, tick: datetime) -> JsonResponse:
    """The period's manifest as a file to keep (the page's and the API's download)."""
    response = JsonResponse(period_manifest(policy, tick), json_dumps_params={"indent": 1})
    name = file_stem(f"{policy.slug}/{tick.isoformat()}")
    response["Content-Disposition"] = f'attachment; filename="{name}.period.manifest.json"'
    response["Cache-Control"] = "no-store"
    return response
