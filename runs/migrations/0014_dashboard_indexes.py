"""The run page's throttle and retry history reads the few troubled chunks of a run through a
partial index (before: every chunk of the run, 100k in the dashboard bench). Built
concurrently: the workers keep writing chunks meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("runs", "0013_any_key_bounds"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="chunk",
            index=models.Index(
                condition=models.Q(
                    ("attempts__gt", 1),
                    models.Q(("throttle_reason", ""), _negated=True),
                    models.Q(("last_error", ""), _negated=True),
                    _connector="OR",
                ),
                fields=["run", "-not_before"],
                name="chunk_troubled",
            ),
        ),
    ]
