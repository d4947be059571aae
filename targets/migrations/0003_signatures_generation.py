"""A stored signature bumps the decisions' generation too: targets' mirrors carry the signatures
their workers verify (runs.fleet.mirror)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("targets", "0002_decision_generation"),
        ("signatures", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE TRIGGER targets_generation_signatures_signature AFTER INSERT OR UPDATE OR"
            " DELETE ON signatures_signature FOR EACH STATEMENT EXECUTE FUNCTION"
            " targets_bump_generation()",
            "DROP TRIGGER targets_generation_signatures_signature ON signatures_signature",
        ),
    ]
