"""The decisions' generation: one row, bumped in the same transaction as every change to a row a
target's ledger mirrors (policies, versions, legal holds, the kill switch). A worker on a target
compares it with the generation that target's mirror was synced to (runs.fleet). The function
runs as its owner, so no login needs a grant on the row."""

from __future__ import annotations

from django.db import migrations

MIRRORED = (
    "retention_policy",
    "retention_policyversion",
    "retention_legalhold",
    "retention_killswitch",
)

FUNCTION = """
CREATE FUNCTION targets_bump_generation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO targets_generation (id, generation) VALUES (1, 1)
        ON CONFLICT (id) DO UPDATE SET generation = targets_generation.generation + 1;
    RETURN NULL;
END $$;
"""


def _triggers() -> list[str]:
    return [
        f"CREATE TRIGGER targets_generation_{table} AFTER INSERT OR UPDATE OR DELETE ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION targets_bump_generation()"
        for table in MIRRORED
    ]


def _drop() -> list[str]:
    return [f"DROP TRIGGER targets_generation_{table} ON {table}" for table in MIRRORED] + [
        "DROP FUNCTION targets_bump_generation()"
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("targets", "0001_registry"),
        ("retention", "0005_hold_release_four_eyes"),
    ]

    operations = [
        migrations.RunSQL(
            "INSERT INTO targets_generation (id, generation) VALUES (1, 0)",
            "DELETE FROM targets_generation",
        ),
        migrations.RunSQL([FUNCTION, *_triggers()], _drop()),
    ]
