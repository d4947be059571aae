"""What the product needs in the database besides its models: the shared cache table
(Django's standard schema, for whichever table the settings name) and the four role groups.
With this, ``migrate`` on an empty database is the whole set-up."""

from django.core.management import call_command
from django.db import migrations

ROLES = ("compliance", "oncall", "auditor", "viewer")  # core.roles.ALL_ROLES at this migration


def create_cache_tables(apps, schema_editor):
    # Creates every database cache table named in CACHES that does not exist yet; nothing
    # when no cache uses the database.
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


def create_role_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.using(schema_editor.connection.alias).get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("auth", "0012_alter_user_first_name_max_length")]

    operations = [
        migrations.RunPython(create_cache_tables, migrations.RunPython.noop),
        migrations.RunPython(create_role_groups, migrations.RunPython.noop),
    ]
