"""The signatures of decisions (``signatures.proof``)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Signature(models.Model):
    """One signed decision: ``content`` is the canonical JSON that was signed (it names its
    own ``kind`` and ``subject``), ``signature`` the Ed25519 signature over it (base64).
    Append-only by grants: only the web login may insert, no login may change a row."""

    kind = models.CharField(max_length=64)
    subject = models.CharField(max_length=120)
    content = models.TextField()
    signature = models.CharField(max_length=128)
    signed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["kind", "subject"], name="signature_kind_subject")]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}"
