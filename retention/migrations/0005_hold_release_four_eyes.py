"""Releasing a legal hold takes two people: the release request, and a check that the
database refuses a release by its own requester."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0004_operator_action_moved_to_core"),
    ]

    operations = [
        migrations.AddField(
            model_name="legalhold",
            name="release_request_reason",
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name="legalhold",
            name="release_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="legalhold",
            name="release_requested_by",
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.AddConstraint(
            model_name="legalhold",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("released_at__isnull", True),
                    models.Q(("released_by", models.F("release_requested_by")), _negated=True),
                    _connector="OR",
                ),
                name="legalhold_release_four_eyes",
                violation_error_message="a hold's release is approved by someone other than the person who requested it",
            ),
        ),
    ]
