"""Audit chain version 2: records also cover the run key and the approved version's facts.

Existing records keep ``chain_version = 1`` and their hash (adding a column rewrites no row
and fires no trigger), so old chains still verify; every new record is version 2."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_schedule_callables")]

    operations = [
        migrations.AddField(
            model_name="auditrecord",
            name="chain_version",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="auditrecord",
            name="chain_version",
            field=models.PositiveSmallIntegerField(default=2),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="run_key",
            field=models.CharField(blank=True, default="", max_length=200),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="version_number",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="version_hash",
            field=models.CharField(blank=True, default="", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="author_id",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="submitted_by_id",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="approved_by_id",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="approved_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditrecord",
            name="approval_reason",
            field=models.TextField(blank=True, default=""),
            preserve_default=False,
        ),
    ]
