"""The operator log moves to core (every app's actions write it; core imports no app).

State only: the table ``retention_operatoraction`` (made by retention's migrations, with
its rows, indexes, append-only trigger and the worker role's grants) stays as it is."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0002_api_tokens"),
        ("retention", "0003_operator_action_chain"),  # the table and its chain columns exist
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OperatorAction",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("actor", models.CharField(max_length=150)),
                        ("action", models.CharField(max_length=64)),
                        ("target_type", models.CharField(max_length=64)),
                        ("target_id", models.CharField(max_length=200)),
                        ("reason", models.TextField(blank=True)),
                        ("details", models.JSONField(blank=True, default=dict)),
                        ("chain_seq", models.BigIntegerField(unique=True)),
                        ("prev_hash", models.CharField(max_length=64)),
                        ("hash", models.CharField(max_length=64)),
                    ],
                    options={
                        "db_table": "retention_operatoraction",
                        "ordering": ["-at", "-id"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
