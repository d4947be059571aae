"""Sign a decision in the process that authenticated the person; verify it anywhere.

A signature covers the canonical bytes of the decision's content (sorted-key compact JSON,
naming its ``kind`` and ``subject``). Verifying a decision is: some stored signature of that
kind and subject verifies under the public key, and its content carries exactly the values
the decision's row holds now (``check``). A row changed behind the product's back, or
written with no signature, fails — and a row's changes cannot borrow another decision's
signature, whose subject or content differ."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from django.conf import settings

from signatures.keys import public_text
from signatures.models import Signature


class SigningRefused(ValueError):
    """This process cannot sign a decision (no private key); the message says where to act."""


NO_KEY = (
    "this process holds no decision-signing key (RETENTION_SIGNING_KEY): decisions are signed "
    "on the web host — use the dashboard, the HTTP API or the `retention` client"
)


def canonical(content: dict) -> str:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def plain(value):
    """``value`` as JSON gives it back (datetimes as ISO text), for comparing with content."""
    return json.loads(json.dumps(value, default=_iso))


def _iso(value):
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def can_sign() -> bool:
    return getattr(settings, "RETENTION_SIGNING_KEY", None) is not None


def sign(kind: str, subject: str, content: dict) -> Signature:
    """Store the signature of ``content`` as decision ``kind`` on ``subject`` (in the
    caller's transaction). ``SigningRefused`` without the private key."""
    key = getattr(settings, "RETENTION_SIGNING_KEY", None)
    if key is None:
        raise SigningRefused(NO_KEY)
    text = canonical({**plain(content), "kind": kind, "subject": subject})
    signature = base64.b64encode(key.sign(text.encode())).decode()
    return Signature.objects.create(kind=kind, subject=subject, content=text, signature=signature)


@lru_cache(maxsize=8192)
def _valid(public: str, content: str, signature: str) -> bool:
    key = settings.RETENTION_VERIFY_KEY
    try:
        key.verify(base64.b64decode(signature, validate=True), content.encode())
    except (InvalidSignature, ValueError):
        return False
    return True


def content_of(signature: Signature) -> dict | None:
    """The signed content, or None when the signature does not verify."""
    key = getattr(settings, "RETENTION_VERIFY_KEY", None)
    if key is None or not _valid(public_text(key), signature.content, signature.signature):
        return None
    try:
        body = json.loads(signature.content)
    except ValueError:
        return None
    if body.get("kind") != signature.kind or body.get("subject") != signature.subject:
        return None
    return body


def check(
    kind: str, subject: str, expected: dict, signatures: Iterable[Signature] | None = None
) -> tuple[dict | None, str]:
    """(the signed content, "") when a signature of ``kind`` on ``subject`` verifies and
    carries every value of ``expected``; else (None, the reason, one line).
    ``signatures``: the candidates, already read (default: read them)."""
    if getattr(settings, "RETENTION_VERIFY_KEY", None) is None:
        return None, "no verify key here (RETENTION_VERIFY_KEY)"
    if signatures is None:
        signatures = Signature.objects.filter(kind=kind, subject=subject).order_by("-pk")
    want = plain(expected)
    reason = f"no signature of {kind}"
    for candidate in signatures:
        if candidate.kind != kind or candidate.subject != subject:
            continue
        body = content_of(candidate)
        if body is None:
            reason = f"the signature of {kind} does not verify"
            continue
        differ = sorted(name for name, value in want.items() if body.get(name) != value)
        if not differ:
            return body, ""
        reason = f"the row's {', '.join(differ)} differ from what was signed"
    return None, reason
