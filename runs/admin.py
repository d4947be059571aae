"""django-q2's admin pages, read-only: a schedule row names a callable the clusters run and
a failed task can be resubmitted from its page, so neither is editable here (schedules
come from ``runs.schedules``)."""

from __future__ import annotations

from django.contrib import admin

from core.admin import make_read_only

for _model in list(admin.site._registry):
    if _model._meta.app_label == "django_q":
        make_read_only(_model)
