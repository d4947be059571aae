"""API token digests become keyed (HMAC under a key from SECRET_KEY) and every account gets
its seal (core.seals): rows written with the database login alone name no working token and
sign no one in. Run with the deployment's SECRET_KEY (the same as the web process's)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def key_the_digests(apps, schema_editor):
    from core.models import keyed_digest  # the keyed digest of this migration's time

    ApiToken = apps.get_model("core", "ApiToken")
    for token in ApiToken.objects.using(schema_editor.connection.alias).all():
        # the stored SHA-256 of the token is what the keyed digest covers
        token.digest = keyed_digest("api-token", token.digest)
        token.save(update_fields=["digest"])


def seal_every_account(apps, schema_editor):
    import json

    from core.models import keyed_digest  # the seal of this migration's time

    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    AccountSeal = apps.get_model("core", "AccountSeal")
    for user in User.objects.using(schema_editor.connection.alias).prefetch_related("groups"):
        identity = [
            user.pk,
            getattr(user, User.USERNAME_FIELD),
            user.password,
            bool(user.is_active),
            bool(user.is_superuser),
            sorted(g.name for g in user.groups.all()),
        ]
        AccountSeal.objects.create(
            user_id=user.pk,
            mac=keyed_digest("account-seal", json.dumps(identity, separators=(",", ":"))),
        )


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0004_oplog_target_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(key_the_digests, migrations.RunPython.noop),
        migrations.CreateModel(
            name="AccountSeal",
            fields=[
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="seal",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                ("mac", models.CharField(max_length=64)),
            ],
        ),
        migrations.RunPython(seal_every_account, migrations.RunPython.noop),
    ]
