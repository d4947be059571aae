"""Personal API tokens (the command line acts as the person who created the token) and the
operator log (``OperatorAction``; written through ``core.oplog.record_action``)."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.crypto import salted_hmac


def keyed_digest(purpose: str, value: str, *, secret: str | None = None) -> str:
    """HMAC-SHA256 of ``value`` under a key derived from ``SECRET_KEY`` for ``purpose``: a row
    only someone holding the key can write. The key is in the processes' environment, never
    in the database, so a database login alone cannot forge one (docs/security.md)."""
    return salted_hmac(
        f"retention-runner.{purpose}", value, secret=secret, algorithm="sha256"
    ).hexdigest()


class ApiToken(models.Model):
    """A personal API token. Only a keyed digest is stored: HMAC-SHA256 of the token's
    SHA-256 under a key from ``SECRET_KEY`` (the token is 256 random bits, so no salt or slow
    hash is needed; the key means a row inserted with the database login alone names no
    working token). The token itself is shown once, at creation. A revoked token stays as
    evidence of what acted when."""

    PREFIX = "rrt_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="the token's first characters")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"token {self.prefix}… of {self.user}"

    @staticmethod
    def digest_of(token: str, *, secret: str | None = None) -> str:
        return keyed_digest("api-token", hashlib.sha256(token.encode()).hexdigest(), secret=secret)

    @staticmethod
    def digests_of(token: str) -> list[str]:
        """The digest under ``SECRET_KEY`` and under each of ``SECRET_KEY_FALLBACKS`` (a key
        being rotated keeps its tokens working until it leaves the fallbacks)."""
        keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
        return [ApiToken.digest_of(token, secret=key) for key in keys]

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class OperatorAction(models.Model):
    """Who did what, when and why: written in the same transaction as the change."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    # Hash-chained like the audit trail (``action_hash``); append-only by trigger.
    chain_seq = models.BigIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        # created by retention's migrations; the model moved here (core/migrations/0003),
        # the table kept its name (the append-only trigger, the worker role's grants)
        db_table = "retention_operatoraction"
        ordering = ["-at", "-id"]
        indexes = [
            # a target's own history and its decision token (``oplog.decision_token``), read
            # by every page with controls: the latest chain position per target
            models.Index(fields=["target_type", "target_id", "chain_seq"], name="oplog_target"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type}:{self.target_id}"


class AccountSeal(models.Model):
    """A keyed digest over what makes a person who they are to the product: username,
    password hash, active and superuser flags, role groups (``core.seals``). Every change the
    product or Django makes through the ORM reseals; a row inserted or changed with the
    database login alone breaks the seal, and a broken seal signs no one in and carries no
    role."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="seal"
    )
    mac = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"seal of user {self.user_id}"
