"""``migrate`` in the product's own schema (database.schema): creates the schema, moves an
older installation's tables there, and migrates with that schema alone on the search path."""

from __future__ import annotations

from django.core.management.commands import migrate
from django.db import connections

from database import schema


class Command(migrate.Command):
    help = migrate.Command.help + " Tables go in the product's own schema (RETENTION_SCHEMA)."

    def handle(self, *args, **options):
        connection = connections[options["database"]]
        for line in schema.ensure(connection):
            if options["verbosity"] >= 1:
                self.stdout.write(line)
        with schema.only_product_schema(connection):
            return super().handle(*args, **options)
