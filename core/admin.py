"""The admin's one rule: product rows are read here and changed only through their actions.

Users and role groups too: a role changes with ``retention role grant|revoke``
(core.accounts: who may, never one's own, an operator-log row), so the role groups are
read-only here and a user's groups field is read-only; memberships are shown."""

from __future__ import annotations

from axes.models import AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin as BaseGroupAdmin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.models import Group, User

from core.models import OperatorAction
from core.roles import ALL_ROLES


class NoWrites:
    """No add, change or delete, for anyone: superusers included."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyAdmin(NoWrites, admin.ModelAdmin):
    """Every field read-only; no add, change or delete (the bulk delete action is gone too)."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def get_actions(self, request):
        return {}


def make_read_only(model) -> None:
    """Re-register another app's admin for ``model`` as read-only (its lists kept)."""
    model_admin = admin.site._registry.get(model)
    if model_admin is None or isinstance(model_admin, ReadOnlyAdmin):
        return
    base = type(model_admin)
    admin.site.unregister(model)
    admin.site.register(model, type(f"ReadOnly{base.__name__}", (ReadOnlyAdmin, base), {}))


# Sign-in evidence (core.signin) is kept: no one edits or deletes it here. Lock-outs
# themselves (axes' AccessAttempt) can still be cleared by staff allowed to delete them.
make_read_only(AccessLog)
make_read_only(AccessFailureLog)

admin.site.unregister(Group)
admin.site.unregister(User)


@admin.register(Group)
class RoleGroupAdmin(NoWrites, BaseGroupAdmin):
    list_display = ("name", "members")
    readonly_fields = ("name", "members")
    fields = ("name", "members")

    @admin.display(description="members")
    def members(self, group) -> str:
        return ", ".join(sorted(group.user_set.values_list("username", flat=True))) or "-"


@admin.register(User)
class RetentionUserAdmin(NoWrites, BaseUserAdmin):
    """People are read-only here too: creating one, setting a password or a flag needs the
    acting superuser's password again and a signed operator-log row (``core.accounts``,
    through ``retention user add`` or the API), which a form of the admin does not give."""

    list_display = ("username", "email", "roles", "is_active", "is_staff", "is_superuser")

    @admin.display(description="roles")
    def roles(self, user) -> str:
        names = sorted(user.groups.filter(name__in=ALL_ROLES).values_list("name", flat=True))
        return ", ".join(names) or "-"

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), "groups", "user_permissions")


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "target_type", "target_id", "reason")
    list_filter = ("action", "target_type")
    search_fields = ("actor", "target_id", "reason")
    date_hierarchy = "at"
