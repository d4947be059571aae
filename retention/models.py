"""Policies, their immutable versions, legal holds and the operator action log."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone as dj_timezone
from django.utils.functional import cached_property

from core import chain, locks
from core.cli_identity import channel


class Policy(models.Model):
    """The stable identity of a retention policy; what it deletes lives in its versions."""

    slug = models.SlugField(max_length=80, unique=True)
    name = models.CharField(max_length=200)
    owner = models.CharField(max_length=150, blank=True)
    enabled = models.BooleanField(default=True)
    paused = models.BooleanField(default=False)
    paused_reason = models.TextField(blank=True)
    schedule = models.CharField(max_length=100, help_text="cron expression, five fields")
    timezone = models.CharField(max_length=64, default="UTC")
    created_at = models.DateTimeField(default=dj_timezone.now)

    class Meta:
        ordering = ["slug"]
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.slug

    @property
    def approved_version(self) -> PolicyVersion | None:
        return self.versions.filter(state=PolicyVersion.State.APPROVED).order_by("-number").first()


class PolicyVersion(models.Model):
    """One immutable description of what a policy deletes.

    ``spec`` is the normalized specification (see ``retention.spec.PolicySpec``);
    once submitted, neither it nor ``content_hash`` change. At most one version
    per policy is approved at a time; approving one supersedes the previous.
    """

    class State(models.TextChoices):
        DRAFT = "draft"
        SUBMITTED = "submitted"
        APPROVED = "approved"
        REJECTED = "rejected"
        SUPERSEDED = "superseded"

    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    spec = models.JSONField()
    content_hash = models.CharField(max_length=64)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="authored_versions"
    )
    created_at = models.DateTimeField(default=dj_timezone.now)
    submitted_at = models.DateTimeField(null=True, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="submitted_versions",
    )
    preview = models.JSONField(
        null=True, blank=True, help_text="dry-run preview taken at submission"
    )
    validation = models.JSONField(
        null=True, blank=True, help_text="warnings found by introspection"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="decided_versions",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    approved_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["policy", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "number"], name="policyversion_unique_number"
            ),
            models.UniqueConstraint(
                fields=["policy"],
                condition=Q(state="approved"),
                name="policyversion_one_approved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy.slug} v{self.number}"

    @cached_property
    def parsed(self):
        """The spec as a PolicySpec (cached: a submitted version never changes)."""
        from retention.spec import PolicySpec

        return PolicySpec.from_json(self.spec)

    def hand_of(self, user) -> str | None:
        """How ``user`` had a hand in this version's content ("wrote", "submitted"), or None.
        Four-eyes: nobody with a hand in it may decide on it."""
        if user.pk == self.author_id:
            return "wrote"
        if user.pk == self.submitted_by_id:
            return "submitted"
        return None


class LegalHold(models.Model):
    """Rows in scope of an active hold are never deleted (enforced inside the DELETE)."""

    policy = models.ForeignKey(
        Policy,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="holds",
        help_text="empty: all policies",
    )
    # NULL means "every tenant"; the DELETE's hold test relies on that (not on '').
    tenant = models.CharField(max_length=200, null=True, blank=True, help_text="empty: all tenants")  # noqa: DJ001
    key_from = models.BigIntegerField(null=True, blank=True)
    key_to = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField()
    placed_by = models.CharField(max_length=150)
    placed_at = models.DateTimeField(default=dj_timezone.now)
    released_by = models.CharField(max_length=150, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-placed_at"]
        indexes = [
            models.Index(
                fields=["policy"], condition=Q(released_at__isnull=True), name="legalhold_active"
            )
        ]

    def __str__(self) -> str:
        scope = self.policy.slug if self.policy_id else "all policies"
        return f"hold #{self.pk} on {scope}"

    @property
    def active(self) -> bool:
        return self.released_at is None


class KillSwitch(models.Model):
    """The global kill switch: while on, no chunk is admitted anywhere."""

    name = models.CharField(max_length=32, primary_key=True, default="global")
    on = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    changed_by = models.CharField(max_length=150, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"kill switch {self.name}: {'on' if self.on else 'off'}"

    @property
    def decision_state(self) -> str:
        return "on" if self.on else "off"

    @property
    def decision_token(self) -> str:
        return decision_token(self)

    def describe(self) -> str:
        if not self.on:
            return "off" + (
                f" (turned off by {self.changed_by}: {self.reason})" if self.changed_by else ""
            )
        return f"ON (turned on by {self.changed_by}: {self.reason})"

    @classmethod
    def is_on(cls) -> bool:
        return cls.objects.filter(name="global", on=True).exists()


class OperatorAction(models.Model):
    """Who did what, when and why: written in the same transaction as the change."""

    at = models.DateTimeField(default=dj_timezone.now, db_index=True)
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
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type}:{self.target_id}"


def decision_token(target) -> str:
    """What a control was rendered for: the target's state and the chain position of the
    latest operator action on it (``paused:42``). A form posts it back as ``expected``; the
    action refuses when the target has moved on since (``check_decision``), so a stale page
    never silently overwrites a newer decision."""
    from django.db.models import Max

    seq = OperatorAction.objects.filter(
        target_type=target._meta.model_name, target_id=str(target.pk)
    ).aggregate(m=Max("chain_seq"))["m"]
    return f"{target.decision_state}:{seq or 0}"


def check_decision(target, expected: str | None, *, now_is: str) -> None:
    """Refuse (``ActionError``) when ``expected`` was posted and the target's decision token
    no longer matches it; call with the target's row locked. ``now_is`` describes the current
    state for the message."""
    from retention.actions import ActionError

    if expected is not None and expected != decision_token(target):
        raise ActionError(
            f"it changed since the page was loaded; it is now {now_is}. Nothing was changed: "
            "reload and decide again"
        )


ACTION_FIELDS = ("chain_seq", "at", "actor", "action", "target_type", "target_id", "reason")


def action_hash(row: dict, prev_hash: str) -> str:
    """An operator action's link: its fields and ``details_text``, PostgreSQL's own text of
    the ``details`` JSON (so the hash does not depend on how Python spells numbers)."""
    fields = {name: row[name] for name in ACTION_FIELDS}
    fields["details"] = row["details_text"]
    return chain.link_hash(fields, prev_hash)


def verify_operator_log(batch: int = 5000) -> chain.ChainReport:
    """Walk the operator-action chain in order, in constant memory."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    rows = chain.batched(
        OperatorAction.objects.annotate(details_text=Cast("details", TextField())),
        [*ACTION_FIELDS, "details_text", "prev_hash", "hash"],
        batch,
    )
    return chain.walk(
        rows,
        lambda row: action_hash(row, row["prev_hash"]),
        noun="operator action",
        gap="operator log gap",
    )


def record_action(actor, action: str, target, *, reason: str = "", **details) -> OperatorAction:
    """Write one operator-action row, chained; call inside the transaction of the change
    (it takes the operator-chain lock until that transaction commits). Within a CLI
    command the row also says so (``via: cli`` and the token, ``core.cli_identity``)."""
    actor_name = getattr(actor, "username", None) or str(actor)
    target_type = (
        target._meta.model_name if hasattr(target, "_meta") else str(type(target).__name__)
    )
    target_id = str(getattr(target, "pk", target))
    details = {**channel(), **details}
    with transaction.atomic():
        locks.xact_lock(locks.OPERATOR_CHAIN, 0)
        with connection.cursor() as cur:
            # after the lock, in its own statement: the head read must see every earlier commit
            cur.execute(
                "SELECT clock_timestamp(), %s::jsonb::text, (SELECT chain_seq FROM"
                " retention_operatoraction ORDER BY chain_seq DESC LIMIT 1), (SELECT hash"
                " FROM retention_operatoraction ORDER BY chain_seq DESC LIMIT 1)",
                [json.dumps(details)],
            )
            at, details_text, last_seq, last_hash = cur.fetchone()
        row = {
            "chain_seq": (last_seq or 0) + 1,
            "at": at,
            "actor": actor_name,
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "reason": reason,
            "details_text": details_text,
        }
        prev = last_hash or chain.GENESIS
        return OperatorAction.objects.create(
            **{k: v for k, v in row.items() if k != "details_text"},
            details=details,
            prev_hash=prev,
            hash=action_hash(row, prev),
        )
