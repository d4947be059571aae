from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0027_cursor_read_above"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditrecord",
            name="archive",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
