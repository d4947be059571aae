"""django-q2's Schedule.name has no unique constraint: two concurrent first arms of a policy's
schedule could create two rows, after which every update_or_create raises. Keep the newest row
of each duplicated name, then make names unique (NULL names stay allowed)."""

from django.db import migrations

FORWARD = """
DELETE FROM django_q_schedule s
 USING django_q_schedule newer
 WHERE s.name IS NOT NULL AND s.name = newer.name AND s.id < newer.id;
CREATE UNIQUE INDEX IF NOT EXISTS runs_schedule_name_unique ON django_q_schedule (name);
"""
BACKWARD = "DROP INDEX IF EXISTS runs_schedule_name_unique;"


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_run_expired_and_held_at"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
