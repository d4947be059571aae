from __future__ import annotations

from django.apps import AppConfig


class SignaturesConfig(AppConfig):
    name = "signatures"
    verbose_name = "Signed decisions"
    default_auto_field = "django.db.models.BigAutoField"
