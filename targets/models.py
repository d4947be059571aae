"""The target registry (in the control database) and the decisions' generation.

A target is a PostgreSQL database the product deletes from. Its row holds a *reference* to its
connection string — the name of an environment variable or the path of a file, read by every
process that connects — never the string itself. The control database is the target
``default`` and has no row.

``Generation`` is one row: in the control database, how many times a decision that a target's
ledger mirrors (policies, versions, holds, the kill switch) has changed — bumped by a trigger in
the deciding transaction (``0002``); in a target, the generation its mirror was last synced to
(``runs.fleet.mirror``).
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"
DEFAULT = "default"


class Target(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[RegexValidator(NAME_PATTERN)])
    dsn_env = models.CharField(max_length=200, blank=True)  # the variable's name, not its value
    dsn_file = models.CharField(max_length=1000, blank=True)  # the file's path, not its content
    group = models.CharField(max_length=63, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, default="system")
    # the last connection failure seen by any process (cleared by the next success): a page
    # names it without connecting, and the runs of this target show "attention" while it lasts
    unreachable_since = models.DateTimeField(null=True, blank=True)
    unreachable_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(dsn_env="") & ~models.Q(dsn_file=""))
                | (~models.Q(dsn_env="") & models.Q(dsn_file="")),
                name="target_one_dsn_reference",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def reference(self) -> str:
        return f"env {self.dsn_env}" if self.dsn_env else f"file {self.dsn_file}"


class Generation(models.Model):
    generation = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="generation_one_row")]

    def __str__(self) -> str:
        return f"generation {self.generation}"
