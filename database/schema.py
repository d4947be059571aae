"""The product's own schema (``settings.DB_SCHEMA``, default ``retention_runner``).

Every table of the product — its own, Django's (``auth_user``, ``django_session``,
``django_migrations``) and django-q2's — lives there, so the product can be installed into an
application's database without sharing the application's users, sessions or migration
history; the application's tables are ordinary targets. ``migrate`` (this app's override)
creates the schema, moves the tables of an installation from before the schema (when the
product's tables were in ``public``) and migrates with the product's schema alone on the
search path, so an application's same-named table is never mistaken for the product's.
"""

from __future__ import annotations

import contextlib

from django.apps import apps
from django.conf import settings
from django.core.cache.backends.db import BaseDatabaseCache
from django.db.backends.signals import connection_created
from django.utils.module_loading import import_string
from psycopg import sql

# SQL functions of the product before the schema existed (runs/migrations 0002, 0019).
LEGACY_FUNCTIONS = ("runs_audit_append_only()", "runs_try_slot(integer, integer[])")


def name() -> str:
    return settings.DB_SCHEMA


def _scalar(cursor, statement, params=()):
    cursor.execute(statement, params)
    row = cursor.fetchone()
    return row[0] if row else None


def _has_table(cursor, schema: str, table: str) -> bool:
    return bool(
        _scalar(
            cursor,
            "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            [schema, table],
        )
    )


def ensure(connection) -> list[str]:
    """Create the product's schema if it is missing, and move the tables of an installation
    made before it (in ``public``) into it. Returns what it did, one line each."""
    schema = name()
    done: list[str] = []
    with connection.cursor() as cursor:
        exists = _scalar(
            cursor, "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", [schema]
        )
        if not exists:
            cursor.execute(
                sql.SQL("CREATE SCHEMA {}")
                .format(sql.Identifier(schema))
                .as_string(cursor.connection)
            )
            done.append(f"created schema {schema}")
        if schema != "public" and _legacy_installation(cursor, schema):
            done.extend(_move_from_public(cursor, schema))
    return done


def _legacy_installation(cursor, schema: str) -> bool:
    """The product's tables are in ``public`` (an installation from before the product's own
    schema) and not yet in ``schema``: ``public.django_migrations`` records the product's own
    apps."""
    if _has_table(cursor, schema, "django_migrations") or not _has_table(
        cursor, "public", "django_migrations"
    ):
        return False
    return bool(
        _scalar(
            cursor,
            "SELECT 1 FROM public.django_migrations WHERE app = 'runs' AND name = '0001_initial'",
        )
    )


def product_table_names() -> list[str]:
    """Every table Retention Runner, Django and the installed apps keep their state in:
    each installed model's table (auth, sessions, django-q2, holds, audit, runs, ...),
    the migration ledger and the database cache tables."""
    names = {"django_migrations"}
    names.update(model._meta.db_table for model in apps.get_models(include_auto_created=True))
    for cache in settings.CACHES.values():
        if issubclass(import_string(cache["BACKEND"]), BaseDatabaseCache):
            names.add(cache["LOCATION"])
    return sorted(names)


def _move_from_public(cursor, schema: str) -> list[str]:
    moved = []
    for table in product_table_names():
        if _has_table(cursor, "public", table):
            cursor.execute(
                sql.SQL("ALTER TABLE public.{} SET SCHEMA {}")
                .format(sql.Identifier(table), sql.Identifier(schema))
                .as_string(cursor.connection)
            )
            moved.append(table)
    for function in LEGACY_FUNCTIONS:
        if _scalar(cursor, "SELECT to_regprocedure(%s)", [f"public.{function}"]):
            cursor.execute(
                sql.SQL("ALTER FUNCTION public.{} SET SCHEMA {}")
                .format(sql.SQL(function), sql.Identifier(schema))
                .as_string(cursor.connection)
            )
    return [f"moved {len(moved)} tables of the product from public to {schema}"] if moved else []


@contextlib.contextmanager
def only_product_schema(connection):
    """The product's schema alone on the search path of ``connection`` (and of any connection
    opened meanwhile): what migrations create and what Django's introspection sees is the
    product's, never an application's table of the same name in ``public``."""
    statement = sql.SQL("SET search_path TO {}").format(sql.Identifier(name()))

    def pin(sender, connection, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute(statement.as_string(cursor.connection))

    connection_created.connect(pin, weak=False)
    try:
        connection.ensure_connection()
        pin(None, connection)
        yield
    finally:
        connection_created.disconnect(pin)
        if connection.connection is not None:
            with connection.cursor() as cursor:
                cursor.execute("RESET search_path")
