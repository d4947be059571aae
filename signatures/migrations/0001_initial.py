import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Signature",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=64)),
                ("subject", models.CharField(max_length=120)),
                ("content", models.TextField()),
                ("signature", models.CharField(max_length=128)),
                ("signed_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["kind", "subject"], name="signature_kind_subject")
                ],
            },
        ),
    ]
