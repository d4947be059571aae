"""Rows only the database side writes: a partition detached through the partition function
(``database.grants.partition_function``), recorded by that function itself — the workers may
read, never write it — so it alone can put the partition back or drop it later."""

from __future__ import annotations

from django.db import models


class DetachedPartition(models.Model):
    """A partition the partition function detached for a run: its table's oid, the table it
    belonged to and the bounds it had there (the catalog's own text)."""

    relid = models.BigIntegerField(primary_key=True)
    run_id = models.BigIntegerField()
    parent = models.TextField()
    bound = models.TextField()
    detached_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"partition {self.relid} detached from {self.parent} by run {self.run_id}"
