"""django-q2's admin pages, read-only: a schedule row names a callable the clusters run and
a failed task can be resubmitted from its page, so neither is editable here (schedules
come from ``runs.schedules``)."""

from __future__ import annotations

from django.contrib import admin

from core.admin import ReadOnlyAdmin


def _read_only_django_q() -> None:
    for model, model_admin in list(admin.site._registry.items()):
        if model._meta.app_label == "django_q" and not isinstance(model_admin, ReadOnlyAdmin):
            base = type(model_admin)
            admin.site.unregister(model)
            admin.site.register(model, type(f"ReadOnly{base.__name__}", (ReadOnlyAdmin, base), {}))


_read_only_django_q()
