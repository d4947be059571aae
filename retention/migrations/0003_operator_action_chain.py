"""The operator-action log is hash-chained like the audit trail.

Rows written before this migration are chained now, in id order (their content is not
changed; the chain attests them from here on, not before)."""

from django.db import migrations, models

from core import chain


def chain_existing_rows(apps, schema_editor):
    from core.oplog import ACTION_FIELDS, action_hash

    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT id, at, actor, action, target_type, target_id, reason, details::text"
            " FROM retention_operatoraction ORDER BY id"
        )
        rows = cur.fetchall()
        if not rows:
            return
        cur.execute("ALTER TABLE retention_operatoraction DISABLE TRIGGER USER")
        prev = chain.GENESIS
        for seq, (pk, *values) in enumerate(rows, start=1):
            row = dict(zip((*ACTION_FIELDS[1:], "details_text"), values, strict=True))
            row["chain_seq"] = seq
            digest = action_hash(row, prev)
            cur.execute(
                "UPDATE retention_operatoraction SET chain_seq = %s, prev_hash = %s, hash = %s"
                " WHERE id = %s",
                [seq, prev, digest, pk],
            )
            prev = digest
        cur.execute("ALTER TABLE retention_operatoraction ENABLE TRIGGER USER")


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0002_policyversion_submitted_by"),
        ("runs", "0002_audit_append_only"),  # the trigger exists when rows are chained
    ]

    operations = [
        migrations.AddField(
            model_name="operatoraction",
            name="chain_seq",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="operatoraction",
            name="prev_hash",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="operatoraction",
            name="hash",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(chain_existing_rows, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="operatoraction",
            name="chain_seq",
            field=models.BigIntegerField(unique=True),
        ),
    ]
