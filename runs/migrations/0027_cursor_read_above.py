from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0026_guard_control_quiet_until"),
    ]

    operations = [
        migrations.AddField(
            model_name="plannercursor",
            name="read_above",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
