"""The decisions' generation function runs only as the triggers that call it: no login may
execute it directly (it is SECURITY DEFINER; a trigger's function is checked for EXECUTE when
the trigger is created, not when it fires)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("targets", "0003_signatures_generation"),
    ]

    operations = [
        migrations.RunSQL(
            "REVOKE ALL ON FUNCTION targets_bump_generation() FROM PUBLIC",
            "GRANT EXECUTE ON FUNCTION targets_bump_generation() TO PUBLIC",
        ),
    ]
