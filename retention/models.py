"""Policies, their immutable versions, legal holds and the kill switch.

The operator log they write is ``core.models.OperatorAction`` (``core.oplog``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone as dj_timezone
from django.utils.functional import cached_property

from core.oplog import decision_token
from retention.spec import PolicySpec


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

    @property
    def decision_state(self) -> str:
        """What a pause, resume, enable or disable decides on (``core.oplog.decision_token``)."""
        return (
            f"{'enabled' if self.enabled else 'disabled'}-{'paused' if self.paused else 'running'}"
        )

    def describe(self) -> str:
        """The policy's state in words, for a refusal of a decision on an older state."""
        state = "enabled" if self.enabled else "disabled"
        return f"{state}, paused: {self.paused_reason}" if self.paused else f"{state}, not paused"


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

    @property
    def label(self) -> str:
        """The version as pages name it: the name it was approved under and its number
        ("Events older than 20 days v1"), whatever the policy is called today."""
        return f"{self.spec.get('name') or self.spec.get('slug') or 'policy'} v{self.number}"

    @cached_property
    def parsed(self):
        """The spec as a PolicySpec (cached: a submitted version never changes)."""
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
    """Rows in scope of an active hold are never deleted (enforced inside the DELETE).

    Releasing one takes two compliance officers (``retention.actions``): one requests the
    release (``release_requested_*``; the hold stays in force), another approves it
    (``released_*``). A pending request is withdrawn by its requester or refused by another
    officer (its fields cleared; the operator log keeps the history). The database refuses a
    release by its own requester (``legalhold_release_four_eyes``)."""

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
    release_requested_by = models.CharField(max_length=150, blank=True)
    release_requested_at = models.DateTimeField(null=True, blank=True)
    release_request_reason = models.TextField(blank=True)
    released_by = models.CharField(max_length=150, blank=True)  # who approved the release
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True)  # the approval's reason

    class Meta:
        ordering = ["-placed_at"]
        indexes = [
            models.Index(
                fields=["policy"], condition=Q(released_at__isnull=True), name="legalhold_active"
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | ~Q(released_by=F("release_requested_by")),
                name="legalhold_release_four_eyes",
                violation_error_message="a hold's release is approved by someone other than "
                "the person who requested it",
            )
        ]

    def __str__(self) -> str:
        scope = self.policy.slug if self.policy_id else "all policies"
        return f"hold #{self.pk} on {scope}"

    @property
    def active(self) -> bool:
        return self.released_at is None

    @property
    def release_pending(self) -> bool:
        """A release was requested and is neither approved, withdrawn nor refused."""
        return self.released_at is None and self.release_requested_at is not None

    @property
    def decision_state(self) -> str:
        if self.released_at is not None:
            return "released"
        return "release requested" if self.release_requested_at is not None else "active"

    @property
    def decision_token(self) -> str:
        return decision_token(self)

    def describe(self) -> str:
        """The hold's state in words, for a refusal on a stale page."""
        if self.released_at is not None:
            return f"released by {self.released_by}"
        if self.release_requested_at is not None:
            return f"awaiting approval of the release {self.release_requested_by} requested"
        return "in force, no release requested"

    def scope(self) -> dict:
        """What the hold covers, who placed it and why: the preview's and the manifest's form."""
        return {
            "id": self.pk,
            "policy": self.policy.slug if self.policy_id else None,
            "tenant": self.tenant,
            "key_from": self.key_from,
            "key_to": self.key_to,
            "reason": self.reason,
            "placed_by": self.placed_by,
        }


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


class RetentionFloor(models.Model):
    """A minimum retention for a target table that no version may go below
    (``retention.floors``): requested by one compliance officer, in force once another
    approves it (``approved_at``) — from ``effective_at``, which for a governance floor that
    lowers the one in force is a waiting period later. Of the approved floors whose
    ``effective_at`` has come, the most recently approved is in force. An approved floor never
    changes and is never removed; a compliance-mode floor is never followed by a shorter one
    — the database refuses both (``rr_floor_guard``), whoever writes."""

    class Mode(models.TextChoices):
        COMPLIANCE = "compliance", "compliance"
        GOVERNANCE = "governance", "governance"

    schema = models.CharField(max_length=63)
    table = models.CharField(max_length=63)
    period = models.CharField(max_length=40, help_text='e.g. "6 years"')
    mode = models.CharField(max_length=12, choices=Mode.choices)
    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField(default=dj_timezone.now)
    request_reason = models.TextField()
    # the floor in force when this one was requested (None: the table had none)
    replaces = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    lowers = models.BooleanField(default=False, help_text="shorter than the floor it replaces")
    approved_by = models.CharField(max_length=150, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    approve_reason = models.TextField(blank=True)
    effective_at = models.DateTimeField(null=True, blank=True)
    refused_by = models.CharField(max_length=150, blank=True)
    refused_at = models.DateTimeField(null=True, blank=True)
    refuse_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(approved_at__isnull=True) | ~Q(approved_by=F("requested_by")),
                name="retentionfloor_four_eyes",
                violation_error_message="a floor is approved by someone other than the person "
                "who requested it",
            ),
            models.UniqueConstraint(
                fields=["schema", "table"],
                condition=Q(approved_at__isnull=True, refused_at__isnull=True),
                name="retentionfloor_one_pending_per_table",
            ),
        ]

    def __str__(self) -> str:
        return f"floor #{self.pk} on {self.schema}.{self.table}"

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def pending(self) -> bool:
        return self.approved_at is None and self.refused_at is None

    def describe(self) -> str:
        """``floor #3 on public.events: 6 years, compliance mode, set by alice``."""
        who = f"set by {self.requested_by}"
        if self.approved_by:
            who += f", approved by {self.approved_by}"
        return f"{self} : {self.period}, {self.mode} mode, {who}".replace(" : ", ": ")
