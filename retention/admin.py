"""Admin: a window onto policies, versions, holds and the operator action log.

State changes go through ``retention.actions`` (role checks, the hold fence, the action
log in the same transaction), so the admin does not change them: versions past draft,
holds and the action log are read-only; a draft can only be deleted; a policy row shows
what its approved version copied onto it."""

from __future__ import annotations

from django.contrib import admin

from retention.models import LegalHold, OperatorAction, Policy, PolicyVersion


class VersionInline(admin.TabularInline):
    model = PolicyVersion
    fields = ("number", "state", "author", "content_hash", "submitted_at", "decided_by")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "owner", "enabled", "paused", "schedule", "timezone")
    list_filter = ("enabled", "paused")
    search_fields = ("slug", "name", "owner")
    inlines = [VersionInline]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = ("policy", "number", "state", "author", "submitted_at", "decided_by")
    list_filter = ("state",)
    search_fields = ("policy__slug", "content_hash")
    ordering = ("policy", "-number")

    def get_readonly_fields(self, request, obj=None):
        # a draft's content defines its hash: change it with a new TOML draft instead
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None or obj.state == PolicyVersion.State.DRAFT

    def has_delete_permission(self, request, obj=None) -> bool:
        return obj is None or obj.state == PolicyVersion.State.DRAFT


@admin.register(LegalHold)
class LegalHoldAdmin(admin.ModelAdmin):
    """Holds are placed and released with their actions (hold fence, audit); read-only here."""

    list_display = ("pk", "policy", "tenant", "key_from", "key_to", "placed_by", "released_at")
    list_filter = ("released_at",)
    search_fields = ("reason", "tenant", "placed_by")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(OperatorAction)
class OperatorActionAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "target_type", "target_id", "reason")
    list_filter = ("action", "target_type")
    search_fields = ("actor", "target_id", "reason")
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
