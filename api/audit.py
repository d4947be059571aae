"""Evidence: verify the chains (against anchors kept outside the database), the latest
signed checkpoint, the audit CSV."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from django.utils import timezone
from ninja import Router

from core.roles import AUDITOR, COMPLIANCE
from retention.models import Policy
from retention.schedule_math import tick_for_period
from runs import cli as run_cli
from runs.evidence import anchors, exports
from runs.evidence import fleet as fleet_evidence

from . import commands, schemas
from .auth import Token
from .errors import ApiError, not_found
from .schemas import ERRORS

router = Router(tags=["audit"])
EVIDENCE = (AUDITOR, COMPLIANCE)


@router.post("/audit/verify", response={200: commands.Output, **ERRORS},
             auth=Token(*EVIDENCE))  # fmt: skip
def verify(request, body: schemas.Anchors):
    """Walk the audit chain and the operator log, check every account's seal, and each anchor
    sent (``retention audit verify --against``); 400 ``command_failed`` lists the problems."""
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i, document in enumerate(body.anchors, 1):
            path = Path(folder) / f"anchor-{i}.json"
            path.write_text(json.dumps(document))
            paths.append(str(path))
        return commands.run(run_cli.audit_verify, against=paths)


@router.get("/audit/checkpoint", response={200: dict, **ERRORS}, auth=Token(*EVIDENCE))
def latest_checkpoint(request):
    """The latest signed checkpoint (what ``retention audit checkpoint`` stores), to keep
    outside the database."""
    checkpoint = anchors.latest_checkpoint()
    if checkpoint is None:
        raise not_found("no signed checkpoint yet (the checkpoint job takes them)")
    return anchors.document(checkpoint)


@router.get("/audit/export.csv", auth=Token(*EVIDENCE), response={200: str, **ERRORS})
def export(request):
    """The audit records as CSV (the audit page's export; filters ``policy``, ``run``,
    ``tenant``, ``from``, ``to``)."""
    filters = exports.AuditFilters.from_query(request.GET)
    if filters.errors:  # the documented error shape, as every other endpoint's
        unknown_run = any(e.startswith("run: no run") for e in filters.errors)
        raise ApiError(404 if unknown_run else 400, "not_found" if unknown_run else "invalid",
                       "; ".join(filters.errors))  # fmt: skip
    return exports.csv_response(filters)


@router.get("/policies/{slug}/manifest.json", auth=Token(*EVIDENCE),
            response={200: dict, **ERRORS})  # fmt: skip
def period_manifest(request, slug: str, period: str = ""):
    """The evidence manifest of a policy's period over every target (``retention evidence
    --policy SLUG --period P``): per target its runs, rows deleted, chain heads and latest
    signed checkpoint, or that it is unreachable. ``period``: ``YYYY-MM-DD`` or
    ``YYYY-MM-DDTHH:MM`` in the policy's timezone (empty: the latest)."""
    policy = Policy.objects.filter(slug=slug).first()
    if policy is None:
        raise not_found(f"no policy {slug!r}")
    try:
        tick = tick_for_period(policy, period or None, timezone.now())
    except (ValueError, OverflowError) as exc:
        raise ApiError(400, "invalid", f"period: {exc}") from None
    return fleet_evidence.manifest_response(policy, tick)
