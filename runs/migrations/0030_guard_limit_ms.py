from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0029_restore_requests"),
    ]

    operations = [
        migrations.AddField(
            model_name="guardcontrol",
            name="limit_ms",
            field=models.FloatField(null=True),
        ),
        migrations.AddField(
            model_name="guardcontrolstep",
            name="limit_ms",
            field=models.FloatField(null=True),
        ),
    ]
