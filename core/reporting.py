"""Error reports (the DEBUG page, mails to ADMINS) never show a password from a
connection URL, whatever the variable is called."""

from __future__ import annotations

from django.views.debug import SafeExceptionReporterFilter

from core.env import redact


class ReporterFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key, value):
        value = super().cleanse_setting(key, value)
        if isinstance(value, str) and "://" in value:
            return redact(value)
        return value
