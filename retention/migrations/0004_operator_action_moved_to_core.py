"""The operator log is core's now (core/migrations/0003_operator_action.py): state only,
the table and its rows stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0003_operator_action_chain"),
        ("core", "0003_operator_action"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OperatorAction")],
            database_operations=[],
        ),
    ]
