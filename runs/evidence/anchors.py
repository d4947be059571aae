"""Anchors of the two hash chains kept outside the database.

An anchor names the head (sequence number and hash) of the audit chain and of the operator
log at a moment, signed with Ed25519 under a key derived from ``RETENTION_EVIDENCE_KEY`` — a
secret only the checkpoint job holds (``retention audit checkpoint``, run by a timer outside
the web process and the workers), and the database does not. Checking a signature needs only
the public half, ``RETENTION_EVIDENCE_PUBLIC_KEY`` (the checkpoint job prints it), which the
web and worker hosts hold: a stored checkpoint is served (on the API, in a manifest, on the
run page) only when its signature verifies, so a row written with a database login alone —
the monitor login may insert checkpoints — is never passed off as signed, and ``audit
verify`` names it. Anchors of earlier releases (``hmac``, HMAC-SHA256 under the secret
itself) still verify where the secret is. The job stores each anchor it signs
(``runs.models.Checkpoint``); a run manifest carries the latest one and the proof that the
chain extends it (``extension``), so nothing signs on demand: a database owner who rewrote
the chain cannot have a fresh anchor signed for it by downloading a manifest.

Checked against the live database (``retention audit verify --against FILE...``), an anchor
shows a chain rewritten at or before its head (the hash there differs, even if every later
link was recomputed) and a chain cut below its head. An anchor covers only records whose
commit is on disk: the checkpoint commits synchronously in the transaction that read the
heads, so a crash of PostgreSQL cannot take back a record an anchor vouches for (chunk
transactions commit asynchronously: a lost one is redone, with a new record).

A target's chains (docs/fleet.md) are anchored the same way, by the same job and key: it reads
their heads on the target, waits until the target's WAL is on disk past them
(``pg_current_wal_flush_lsn``), signs them with the target's name and stores the anchor in the
*control* database (``take_target_checkpoint``), where none of the target's logins can remove
or replace it. ``audit verify`` checks every target's chain against its latest one
(``check_stored``), and a period's manifest carries each target's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.chain import GENESIS
from core.models import OperatorAction
from core.oplog import verify_operator_log
from runs.evidence.audit import walk_records
from runs.models import AuditRecord, Checkpoint
from targets import connections as C

FORMAT = "retention-runner chain anchor"
MAX_PROOF_PROBLEMS = 20
SIGNED = "ed25519:"  # a stored signature's prefix; without it, an earlier release's HMAC
# newest stored checkpoints looked at for one that verifies
MAX_CHECKPOINTS_SCANNED = 100
# how long a target's checkpoint waits for the target's WAL to reach disk past the heads it read
FLUSH_WAIT_S = 10.0
log = logging.getLogger(__name__)


class NoEvidenceKey(ValueError):
    """A checkpoint must be signed, and this process has no ``RETENTION_EVIDENCE_KEY``."""


class ChainContradicted(RuntimeError):
    """A target's chains no longer hold what its last checkpoint anchored."""


def _key() -> bytes | None:
    return getattr(settings, "RETENTION_EVIDENCE_KEY", None) or None


def _head(model) -> dict:
    row = model.objects.order_by("-chain_seq").values("chain_seq", "hash").first()
    return {"seq": row["chain_seq"], "hash": row["hash"]} if row else {"seq": 0, "hash": None}


def _text(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _hmac(key: bytes, body: dict) -> str:
    """An earlier release's signature (HMAC-SHA256 under the secret itself)."""
    return hmac.new(key, _text(body), hashlib.sha256).hexdigest()


def _private_key() -> Ed25519PrivateKey | None:
    """The signing key, derived from ``RETENTION_EVIDENCE_KEY`` (so a deployment keeps its
    secret); None without it."""
    secret = _key()
    if secret is None:
        return None
    seed = hashlib.sha256(b"retention-runner evidence key\x00" + secret).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key_hex() -> str | None:
    """The public half of the signing key, as ``RETENTION_EVIDENCE_PUBLIC_KEY`` takes it."""
    private = _private_key()
    if private is None:
        return None
    return private.public_key().public_bytes_raw().hex()


def _public_key() -> Ed25519PublicKey | None:
    configured = getattr(settings, "RETENTION_EVIDENCE_PUBLIC_KEY", None)
    if configured:
        return Ed25519PublicKey.from_public_bytes(configured)
    private = _private_key()
    return private.public_key() if private else None


def _sign(body: dict) -> str:
    return SIGNED + _private_key().sign(_text(body)).hex()


def signature_problem(found: dict) -> str | None:
    """None when the anchor ``found`` (a document) carries a signature that verifies with
    the public key; else why not, one sentence."""
    body = {k: v for k, v in found.items() if k not in ("signature", "hmac")}
    signature = found.get("signature")
    if signature:
        public = _public_key()
        if public is None:
            return "cannot check its signature: RETENTION_EVIDENCE_PUBLIC_KEY is not set"
        if not isinstance(signature, str) or not signature.startswith(SIGNED):
            return "the anchor's signature is of no known kind"
        try:
            public.verify(bytes.fromhex(signature[len(SIGNED) :]), _text(body))
        except (InvalidSignature, ValueError):
            return "the anchor's signature does not match (forged, or another key)"
        return None
    if found.get("hmac"):
        key = _key()
        if key is None:
            return (
                "cannot check its signature: an earlier release's HMAC anchor needs "
                "RETENTION_EVIDENCE_KEY"
            )
        if not hmac.compare_digest(str(found["hmac"]), _hmac(key, body)):
            return "the anchor's signature does not match (forged, or another key)"
        return None
    return "the anchor is not signed"


def _body(checkpoint: Checkpoint) -> dict:
    body = {
        "anchor": FORMAT,
        "at": checkpoint.at.isoformat(),
        "audit": {"seq": checkpoint.audit_seq, "hash": checkpoint.audit_hash or None},
        "operator": {"seq": checkpoint.operator_seq, "hash": checkpoint.operator_hash or None},
    }
    if checkpoint.target:  # signed with the chains it names: never passed off as another's
        body["target"] = checkpoint.target
    return body


def document(checkpoint: Checkpoint) -> dict:
    """The signed anchor a checkpoint stores, as a file or a manifest carries it."""
    stored = checkpoint.signature
    if stored.startswith(SIGNED):
        return {**_body(checkpoint), "signature": stored}
    return {**_body(checkpoint), "hmac": stored}


def take_checkpoint() -> Checkpoint:
    """Read both chains' heads, sign them and store the checkpoint, in one transaction that
    commits synchronously: its commit flushes the WAL past every record the heads name (they
    were committed before its snapshot), so the anchor never vouches for a record a crash
    can take back. Needs ``RETENTION_EVIDENCE_KEY`` (``NoEvidenceKey`` otherwise); write the
    anchor anywhere only after this returns."""
    key = _key()
    if key is None:
        raise NoEvidenceKey("RETENTION_EVIDENCE_KEY is not set: a checkpoint must be signed")
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = on")
        audit, operator = _head(AuditRecord), _head(OperatorAction)
        checkpoint = _signed(audit, operator)
        checkpoint.save()
    return checkpoint


def _signed(audit: dict, operator: dict, **fields) -> Checkpoint:
    """A checkpoint of the two chains' heads, signed (not yet stored)."""
    checkpoint = Checkpoint(
        at=timezone.now(),
        audit_seq=audit["seq"],
        audit_hash=audit["hash"] or "",
        operator_seq=operator["seq"],
        operator_hash=operator["hash"] or "",
        host=socket.gethostname()[:200],
        **fields,
    )
    checkpoint.signature = _sign(_body(checkpoint))
    return checkpoint


def _flushed_past_now() -> None:
    """Wait until the WAL of the database in place is on disk past every commit made before
    this call (its insert position now): a chunk's commit there may be asynchronous. Raises
    ``RuntimeError`` after ``FLUSH_WAIT_S``."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        (lsn,) = cur.fetchone()
        deadline = time.monotonic() + FLUSH_WAIT_S
        while True:
            cur.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [lsn])
            if cur.fetchone()[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"its WAL did not reach disk past {lsn} in {FLUSH_WAIT_S:g} s")
            time.sleep(0.05)


def take_target_checkpoint(name: str) -> Checkpoint:
    """Read target ``name``'s chains' heads (on the target), wait until its WAL is on disk past
    them, sign them with its name and store the checkpoint in the control database (called
    there). ``NoEvidenceKey`` without the key; ``ChainContradicted`` when the target's chains
    no longer hold what its previous checkpoint anchored (a rewrite: the job never signs it);
    the target's own errors as they come (a target that does not answer). Nothing is stored
    then."""
    if _key() is None:
        raise NoEvidenceKey("RETENTION_EVIDENCE_KEY is not set: a checkpoint must be signed")
    previous = latest_checkpoint(name)
    with C.on(name):
        with transaction.atomic():
            audit, operator = _head(AuditRecord), _head(OperatorAction)
            # never sign a chain that contradicts the target's last anchor: its heads would
            # bless a rewrite the last anchor still shows (and `audit verify` reads the latest)
            contradicted = check_stored(previous) if previous else []
        if contradicted:
            raise ChainContradicted(
                f"its chains contradict checkpoint #{previous.pk}, so it is not signed: "
                + "; ".join(contradicted)
            )
        _flushed_past_now()
    checkpoint = _signed(audit, operator, target=name)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = on")
        checkpoint.save()
    return checkpoint


def latest_checkpoint(target: str = "") -> Checkpoint | None:
    """The newest stored checkpoint of ``target``'s chains ('': this database's own) whose
    signature verifies (``signature_problem``); one that does not — a row written without
    the key — is skipped, never served as signed. Read in the database in place (a target's
    are in the control database)."""
    stored = Checkpoint.objects.filter(target=target).order_by("-id")
    for checkpoint in stored[:MAX_CHECKPOINTS_SCANNED]:
        problem = signature_problem(document(checkpoint))
        if problem is None:
            return checkpoint
        log.warning("checkpoint #%s is not served: %s", checkpoint.pk, problem)
    return None


def unverified_checkpoints() -> list[str]:
    """One line per stored checkpoint whose signature does not verify (``audit verify``);
    nothing when this process has no key to check with."""
    if _public_key() is None:
        return []
    return [
        f"checkpoint #{checkpoint.pk}{f' (target {checkpoint.target})' if checkpoint.target else ''}"
        f" of {checkpoint.at:%Y-%m-%d %H:%M}: {problem} — stored "
        "without the checkpoint job's key, never served"
        for checkpoint in Checkpoint.objects.order_by("id")
        if (problem := signature_problem(document(checkpoint))) is not None
    ]


def status(checkpoint: Checkpoint | None, target: str = "") -> str:
    """One sentence on what anchors the evidence now (the run page's and the manifest's)."""
    if target and checkpoint is None:
        return (
            f"No signed checkpoint of target {target} yet: the checkpoint job (`retention "
            "audit checkpoint`, with RETENTION_EVIDENCE_KEY) signs every target's chains."
        )
    if target:
        return (
            f"Anchored by signed checkpoint #{checkpoint.pk} of {checkpoint.at:%Y-%m-%d %H:%M} "
            f"UTC of target {target} (audit record {checkpoint.audit_seq}, operator action "
            f"{checkpoint.operator_seq}), stored in the control database; records after it "
            "are shown linked to it, not signed."
        )
    if checkpoint is None and Checkpoint.objects.filter(target=target).exists():
        return (
            "No verified checkpoint: the stored checkpoints' signatures do not verify here "
            "(RETENTION_EVIDENCE_PUBLIC_KEY unset, or rows not written by the checkpoint job; "
            "`retention audit verify` names them)."
        )
    if checkpoint is None:
        return (
            "No signed checkpoint yet: this installation's evidence is not anchored outside "
            "the database. The checkpoint job (`retention audit checkpoint`, with "
            "RETENTION_EVIDENCE_KEY; deploy/systemd/retention-checkpoint.timer) signs one."
        )
    return (
        f"Anchored by signed checkpoint #{checkpoint.pk} of {checkpoint.at:%Y-%m-%d %H:%M} UTC "
        f"(audit record {checkpoint.audit_seq}, operator action {checkpoint.operator_seq}); "
        "records after it are shown linked to it, not signed. Verify against anchors you "
        "stored yourself: `retention audit verify --against FILE`."
    )


def _extends(report, anchored: int, anchored_hash: str | None, model, noun: str) -> dict:
    problems = list(report.problems)
    if anchored:
        actual = model.objects.filter(chain_seq=anchored).values_list("hash", flat=True).first()
        if actual != anchored_hash:
            problems.insert(0, f"{noun} {anchored} no longer has the anchored hash")
    return {
        "from_seq": anchored,
        "from_hash": anchored_hash,
        "to_seq": report.head_seq,
        "to_hash": None if report.head == GENESIS else report.head,
        "records": report.records,
        "ok": not problems,
        "problems": problems[:MAX_PROOF_PROBLEMS],
    }


def extension(checkpoint: Checkpoint) -> dict:
    """The proof that both chains extend a checkpoint: the anchored record still has the
    anchored hash, and the records after it, up to the current head, verify as a chain from
    that hash (each its content's hash, each linked to the one before, no gap)."""
    audit_from = (checkpoint.audit_seq, checkpoint.audit_hash or GENESIS)
    operator_from = (checkpoint.operator_seq, checkpoint.operator_hash or GENESIS)
    return {
        "audit": _extends(
            walk_records(after=audit_from),
            checkpoint.audit_seq,
            checkpoint.audit_hash or None,
            AuditRecord,
            "audit record",
        ),
        "operator": _extends(
            verify_operator_log(after=operator_from),
            checkpoint.operator_seq,
            checkpoint.operator_hash or None,
            OperatorAction,
            "operator action",
        ),
    }


def _load(path: str) -> list[dict]:
    """The anchors a file holds: a checkpoint file (one anchor, or ``anchors``: the control
    database's and every target's, as ``audit checkpoint`` writes them for a fleet), a run
    manifest's ``anchor``, or a period manifest's (``control`` and each of ``targets``)."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc.__class__.__name__})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: holds no chain anchor")
    if document.get("anchor") == FORMAT:
        return [document]
    if "anchors" in document:
        found = document["anchors"]
    elif "targets" in document and "control" in document:  # a period's manifest
        entries = [document["control"], *document["targets"]]
        found = [e.get("anchor") for e in entries if isinstance(e, dict)]
    elif "anchor" in document:  # a run manifest
        found = [document["anchor"]]
    else:
        raise ValueError(f"{path}: holds no chain anchor")
    anchors = [a for a in found or [] if a is not None]
    if not anchors:
        raise ValueError(f"{path}: holds no signed checkpoint (none existed when it was generated)")
    if not all(isinstance(a, dict) and a.get("anchor") == FORMAT for a in anchors):
        raise ValueError(f"{path}: holds no chain anchor")
    return anchors


def _contradictions(found: dict, source: str) -> list[str]:
    """What the chains of the database in place contradict in the anchor ``found`` (its
    signature already checked); ``source`` names where the anchor came from."""
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
                f"{label} ends at record {head['seq']} but {source} anchors record {seq}: "
                "records were removed"
            )
            continue
        actual = model.objects.filter(chain_seq=seq).values_list("hash", flat=True).first()
        if actual != want.get("hash"):
            problems.append(
                f"{noun} {seq} differs from the anchor in {source}: the chain was rewritten "
                "at or before it"
            )
    return problems


def check(path: str) -> list[str]:
    """What the live chains contradict in the anchors in the file at ``path`` ([] when they
    hold): the control database's against its chains, a target's (``target``) against that
    target's, each problem naming the target. Called on the control database."""
    try:
        found = _load(path)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    for anchor in found:
        target = anchor.get("target") or ""
        where = f"target {target}: " if target else ""
        problem = signature_problem(anchor)
        if problem is not None:
            problems.append(f"{where}{path}: {problem}")
            continue
        if not target:
            problems.extend(_contradictions(anchor, path))
            continue
        if target not in C.all_names():
            problems.append(f"{path}: anchors target {target}, which is not registered")
            continue
        try:
            with C.on(target):
                problems.extend(where + p for p in _contradictions(anchor, path))
        except Exception as exc:  # noqa: BLE001 - a target that does not answer, one line
            problems.append(f"{where}not checked against {path}: {C.first_line(exc)}")
        finally:
            C.close_all()
    return problems


def check_stored(checkpoint: Checkpoint) -> list[str]:
    """What the chains of the database in place (the checkpoint's target's) contradict in a
    stored checkpoint, read from the control database before."""
    source = f"checkpoint #{checkpoint.pk} of {checkpoint.at:%Y-%m-%d %H:%M}"
    return _contradictions(document(checkpoint), source)
