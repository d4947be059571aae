"""Progress sums a run's audit trail incrementally (runs.progress.audit_tallies) and reads
afresh only the last ten minutes of it, a range of the run's commit times; the run page's
rows/s chart reads the same range for the whole run without visiting the heap; the rows per
table cascades reached are read from a partial index holding only the records that have
them (before: every audit record of the run). Built concurrently: the workers keep writing
audit rows meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("runs", "0024_run_rollout_and_chunk_counts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="auditrecord",
            index=models.Index(
                fields=["run", "committed_at"], include=["rows_deleted"], name="audit_run_time"
            ),
        ),
        AddIndexConcurrently(
            model_name="auditrecord",
            index=models.Index(
                condition=models.Q(("table_rows__isnull", False)),
                fields=["run"],
                name="audit_cascaded",
            ),
        ),
    ]
