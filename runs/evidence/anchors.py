"""Anchors of the two hash chains kept outside the database.

An anchor names the head (sequence number and hash) of the audit chain and of the operator
log at a moment, signed with HMAC-SHA256 under ``RETENTION_EVIDENCE_KEY`` — a key the web
process and the CLI hold and the database does not. Every run manifest carries one, and
``retention audit checkpoint`` writes one for an auditor to keep. Checked against the live
database (``retention audit verify --against FILE...``), an anchor shows a chain rewritten
at or before its head (the hash there differs, even if every later link was recomputed)
and a chain cut below its head; a database owner without the key cannot write an anchor
that matches a rewritten chain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from core.models import OperatorAction
from runs.models import AuditRecord

FORMAT = "retention-runner chain anchor"


def _key() -> bytes | None:
    return getattr(settings, "RETENTION_EVIDENCE_KEY", None) or None


def _head(model) -> dict:
    row = model.objects.order_by("-chain_seq").values("chain_seq", "hash").first()
    return {"seq": row["chain_seq"], "hash": row["hash"]} if row else {"seq": 0, "hash": None}


def _signature(key: bytes, body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def anchor() -> dict:
    """The heads of both chains now, signed (``hmac`` is None without an evidence key)."""
    body = {
        "anchor": FORMAT,
        "at": timezone.now().isoformat(),
        "audit": _head(AuditRecord),
        "operator": _head(OperatorAction),
    }
    key = _key()
    return {**body, "hmac": _signature(key, body) if key else None}


def _load(path: str) -> dict:
    """The anchor in a checkpoint file, or in a run manifest's ``anchor``."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc.__class__.__name__})") from None
    found = document.get("anchor") if isinstance(document, dict) else None
    if isinstance(found, dict):
        document = found
    if not isinstance(document, dict) or document.get("anchor") != FORMAT:
        raise ValueError(f"{path}: holds no chain anchor")
    return document


def check(path: str) -> list[str]:
    """What the live chains contradict in the anchor at ``path`` ([] when it holds)."""
    try:
        found = _load(path)
    except ValueError as exc:
        return [str(exc)]
    key = _key()
    body = {k: v for k, v in found.items() if k != "hmac"}
    if key is None:
        return [f"{path}: cannot check its signature: RETENTION_EVIDENCE_KEY is not set"]
    if not found.get("hmac"):
        return [f"{path}: the anchor is not signed"]
    if not hmac.compare_digest(str(found["hmac"]), _signature(key, body)):
        return [f"{path}: the anchor's signature does not match (forged, or another key)"]
    problems = []
    for name, model, noun in (
        ("audit", AuditRecord, "audit record"),
        ("operator", OperatorAction, "operator action"),
    ):
        want = found.get(name) or {}
        seq = want.get("seq") or 0
        if not seq:
            continue
        head = _head(model)
        if head["seq"] < seq:
            label = "the audit chain" if name == "audit" else "the operator log"
            problems.append(
                f"{label} ends at record {head['seq']} but {path} anchors record {seq}: "
                "records were removed"
            )
            continue
        actual = model.objects.filter(chain_seq=seq).values_list("hash", flat=True).first()
        if actual != want.get("hash"):
            problems.append(
                f"{noun} {seq} differs from the anchor in {path}: the chain was rewritten "
                "at or before it"
            )
    return problems
