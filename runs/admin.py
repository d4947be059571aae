"""django-q2's admin pages, read-only: a schedule row names a callable the clusters run and
a failed task can be resubmitted from its page, so neither is editable here (schedules
come from ``runs.engine.schedules``). Task results are not shown at all: their arguments and results
are pickles written by the workers, and loading a row unpickles them (docs/security.md)."""

from __future__ import annotations

from django.contrib import admin
from picklefield import PickledObjectField

from core.admin import make_read_only


def _last_run(self, obj):
    return getattr(obj, "task_name", None)  # the name only: the task pages are not served


_last_run.short_description = "last run"

for _model in list(admin.site._registry):
    if _model._meta.app_label != "django_q":
        continue
    if any(isinstance(field, PickledObjectField) for field in _model._meta.fields):
        admin.site.unregister(_model)  # Success, Failure: never unpickled by the web
    else:
        make_read_only(_model)
        type(admin.site._registry[_model]).get_last_run = _last_run  # schedules link tasks
