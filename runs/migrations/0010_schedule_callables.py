"""A django-q2 schedule may only name the product's scheduled tasks and no hook.

The scheduler imports and calls whatever ``func`` (and ``hook``) a schedule row names, and
the worker role may write that table (the cleanup cluster re-arms the triggers): without
this constraint a leaked worker credential could schedule any callable. A new scheduled task
needs a migration that widens the list (``runs.engine.schedules.SCHEDULED_TASKS``)."""

from django.db import migrations

# runs.engine.schedules.SCHEDULED_TASKS at this migration
TASKS = ("runs.tasks.trigger_scheduled", "runs.tasks.reconcile", "demo.tasks.send_due_reminders")

SQL = """
ALTER TABLE django_q_schedule ADD CONSTRAINT runs_schedule_product_tasks_only
    CHECK (func IN ({tasks}) AND coalesce(hook, '') = '')
""".format(tasks=", ".join(f"'{t}'" for t in TASKS))

REVERSE = "ALTER TABLE django_q_schedule DROP CONSTRAINT IF EXISTS runs_schedule_product_tasks_only"


class Migration(migrations.Migration):
    dependencies = [
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
        ("runs", "0009_schedule_name_unique"),
    ]
    operations = [migrations.RunSQL(SQL, REVERSE)]
