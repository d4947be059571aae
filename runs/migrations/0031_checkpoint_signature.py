"""A checkpoint's signature is Ed25519 (``ed25519:`` and 128 hex digits), verified with the
public half wherever it is served (``runs.evidence.anchors``); the column keeps its name."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0030_guard_limit_ms")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameField("checkpoint", "hmac", "signature"),
                migrations.AlterField(
                    "checkpoint",
                    "signature",
                    models.CharField(max_length=200, db_column="hmac"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE runs_checkpoint ALTER COLUMN hmac TYPE varchar(200)",
                    reverse_sql="ALTER TABLE runs_checkpoint ALTER COLUMN hmac TYPE varchar(64)",
                )
            ],
        )
    ]
