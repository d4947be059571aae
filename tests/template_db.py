"""One migrated template database per set of migrations, cloned for each test process.

Migrating the product's schema costs each test process tens of seconds on a busy machine;
``CREATE DATABASE … TEMPLATE`` copies a migrated one in about a second. The first process to
take the lock migrates the template (under a temporary name, renamed when complete, so a
process killed half way leaves nothing another would clone); every process then clones its own
test database from it. The template's name carries a digest of the migrations and the
product's schema name, so a changed migration gets a new template and the stale ones are
dropped. Real PostgreSQL throughout: the same migrations, the same server."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

import psycopg
from django.conf import settings
from django.db import connections
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "rr_tpl_"


def migrations_digest() -> str:
    digest = hashlib.sha256(str(settings.DB_SCHEMA).encode())
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _admin(params: dict) -> psycopg.Connection:
    """An autocommit session on the server's maintenance database."""
    kwargs = {k: v for k, v in params.items() if k in ("host", "port", "user", "password")}
    return psycopg.connect(dbname="postgres", autocommit=True, **kwargs)


def _exists(conn: psycopg.Connection, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
    )


def _drop(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _migrate_template(alias: str, name: str) -> None:
    """Create and migrate ``name`` with Django's own test-database creation, then close."""
    conn = connections[alias]
    original = conn.settings_dict["NAME"]
    test_settings = conn.settings_dict.setdefault("TEST", {})
    original_test_name = test_settings.get("NAME")
    test_settings["NAME"] = name
    try:
        conn.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    finally:
        conn.close()
        conn.settings_dict["NAME"] = original
        test_settings["NAME"] = original_test_name


def clone_test_database(alias: str = "default") -> str:
    """Give this process its own test database, cloned from the migrated template; returns
    its name. The connection's settings point at it afterwards."""
    conn = connections[alias]
    params = conn.get_connection_params()
    target = conn.creation._get_test_db_name()
    template = f"{PREFIX}{migrations_digest()}"
    server = hashlib.sha256(f"{params.get('host', '')}:{params.get('port', '')}".encode())
    lock_path = Path(tempfile.gettempdir()) / f"retention-{template}-{server.hexdigest()[:8]}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _admin(params) as admin:
            if not _exists(admin, template):
                for (stale,) in admin.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"]
                ).fetchall():
                    _drop(admin, stale)
                building = f"{template}_{os.getpid()}"
                _migrate_template(alias, building)
                admin.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(template)
                    )
                )
    with _admin(params) as admin:
        _drop(admin, target)
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(target), sql.Identifier(template)
            )
        )
    conn.close()
    conn.settings_dict["NAME"] = target
    return target


def drop_test_database(alias: str, name: str) -> None:
    conn = connections[alias]
    conn.close()
    with _admin(conn.get_connection_params()) as admin:
        _drop(admin, name)
