"""Admin: a read-only window onto policies, versions, holds and the operator action log.

State changes go through ``retention.actions`` (role checks, four-eyes, the hold fence,
the action log in the same transaction), so the admin changes nothing: no add, change or
delete for anyone, superusers included. Seeing a model needs its ``view`` permission (or
superuser), as Django's admin checks it."""

from __future__ import annotations

from django.contrib import admin

from core.admin import NoWrites, ReadOnlyAdmin
from retention.models import LegalHold, Policy, PolicyVersion


class VersionInline(NoWrites, admin.TabularInline):
    model = PolicyVersion
    fields = (
        "number",
        "state",
        "author",
        "submitted_by",
        "content_hash",
        "submitted_at",
        "decided_by",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(Policy)
class PolicyAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "owner", "enabled", "paused", "schedule", "timezone")
    list_filter = ("enabled", "paused")
    search_fields = ("slug", "name", "owner")
    inlines = [VersionInline]


@admin.register(PolicyVersion)
class PolicyVersionAdmin(ReadOnlyAdmin):
    list_display = (
        "policy",
        "number",
        "state",
        "author",
        "submitted_by",
        "submitted_at",
        "decided_by",
    )
    list_filter = ("state",)
    search_fields = ("policy__slug", "content_hash")
    ordering = ("policy", "-number")


@admin.register(LegalHold)
class LegalHoldAdmin(ReadOnlyAdmin):
    """Holds are placed and released with their actions (hold fence, audit)."""

    list_display = ("pk", "policy", "tenant", "key_from", "key_to", "placed_by", "released_at")
    list_filter = ("released_at",)
    search_fields = ("reason", "tenant", "placed_by")
