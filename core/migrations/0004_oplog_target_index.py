"""An index for a target's operator actions: the run page's history and every control's
decision token read the latest chain position of one target (previously a scan of the log)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # built concurrently: every action appends to the log meanwhile

    dependencies = [
        ("core", "0003_operator_action"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="operatoraction",
            index=models.Index(
                fields=["target_type", "target_id", "chain_seq"], name="oplog_target"
            ),
        ),
    ]
