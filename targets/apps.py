from __future__ import annotations

from django.apps import AppConfig


class TargetsConfig(AppConfig):
    name = "targets"
    verbose_name = "Targets: the databases the product deletes from"
