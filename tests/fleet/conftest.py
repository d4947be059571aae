"""Fixtures of the fleet's tests: target databases on several PostgreSQL servers, each with the
ledger installed by ``retention target migrate`` once per session and emptied before each test."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import psycopg
import pytest
from django.core.management import call_command

from tests.fleet import servers


@dataclass
class TargetDb:
    name: str  # the target's name in the registry
    env: str  # the variable holding its URL in this process
    url: str
    server: servers.Server
    database: str

    def connect(self):
        return psycopg.connect(self.url, autocommit=True)

    def scalar(self, query: str, params=()):
        with self.connect() as conn:
            return conn.execute(query, params).fetchone()[0]


def migrate_url(url: str) -> None:
    """The ledger, installed as ``retention target migrate`` does: ``manage.py migrate`` in a
    process whose ``DATABASE_URL`` is the target's."""
    env = {**os.environ, "DATABASE_URL": url, "RETENTION_DEMO": "1"}
    done = subprocess.run(
        [sys.executable, str(servers.ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


LEDGER_TRUNCATE = """
DO $$ DECLARE t text; BEGIN
  SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') INTO t FROM pg_tables
   WHERE schemaname = 'retention_runner' AND tablename <> 'django_migrations';
  EXECUTE 'TRUNCATE ' || t || ' RESTART IDENTITY CASCADE';
END $$;
"""


@pytest.fixture(scope="session")
def fleet_servers():
    """Two embedded servers of the fleet's own and the machine's PostgreSQL 15."""
    return [servers.embedded("fleet-a"), servers.embedded("fleet-b"), servers.machine()]


@pytest.fixture(scope="session")
def fleet_databases(fleet_servers, django_db_blocker):
    """One database with the ledger on each server (three targets), dropped at the end."""
    made = []
    for i, server in enumerate(fleet_servers):
        database = server.create_database(template=server.ledger_template(migrate_url))
        url = server.admin_url(database)
        made.append(TargetDb(f"shard{i + 1}", f"FLEET_TEST_DSN_{i + 1}", url, server, database))
    yield made
    for target in made:
        target.server.drop_database(target.database)


@pytest.fixture
def fleet(fleet_databases, monkeypatch, transactional_db):
    """The three targets registered (group ``shards``), their ledgers empty; the DSNs in this
    process's environment."""
    from runs.fleet import mirror
    from targets.models import Target

    mirror.forget()
    for target in fleet_databases:
        monkeypatch.setenv(target.env, target.url)
        with target.connect() as conn:
            conn.execute(LEDGER_TRUNCATE)
        Target.objects.create(name=target.name, dsn_env=target.env, group="shards")
    yield fleet_databases
    from targets import connections

    connections.close_all()
    mirror.forget()


@pytest.fixture(autouse=True)
def fresh_readings():
    """Each test's pages start from no reading of any target (runs.fleet.view keeps the last
    reading of each target in the process, by name, and the tests reuse the names)."""
    from runs.fleet import view

    view.forget()
    yield
    # a read still in progress (a page that asked before the test ended) reads the control
    # database in a transaction of its own: it ends before the test's database is emptied
    for read in list(view._reads.values()):
        with contextlib.suppress(Exception):
            read.future.result(timeout=60)
    view.forget()


def _not_answering(url: str, page: str) -> set[str]:
    """The targets ``page`` says do not answer (a read still waiting after ``SILENT_S``)."""
    names = set(re.findall(r"(\w+)</a> — unreachable: does not answer", page))
    # the tile's own words: not a later tile's on the same line
    names |= set(
        re.findall(
            r'data-target="(\w+)"(?:(?!data-target=)[^\n])*?does not answer \(its ledger', page
        )
    )
    own = re.fullmatch(r"/runs/targets/(\w+)/", url)
    if own and "Not read: the target does not answer." in page:
        names.add(own.group(1))
    return names


def read_page(client, url: str, *, within_s: float = 60.0, silent=(), **headers) -> str:
    """``url``'s content once no target on it is still being read: the pages never wait for a
    target's ledger, they say "reading…" (``data-reading``) and are asked again, as the
    browser's fragment does a second later. A target whose read a busy machine slowed past
    ``SILENT_S`` is said not to answer until its read ends: asked again too, unless it is one
    of ``silent`` (the targets the test makes not answer)."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        response = client.get(url, **headers)
        assert response.status_code == 200, (url, response.status_code)
        page = response.content.decode()
        settled = "data-reading" not in page and not _not_answering(url, page) - set(silent)
        if settled or time.monotonic() > deadline:
            return page
        time.sleep(0.2)


SECRET = "s3cret-fleet-pw"


def with_password(url: str, password: str = SECRET) -> str:
    """``url`` with a password for its login: the test servers trust local logins and ignore
    it, so it works — and must then never show anywhere."""
    return re.sub(r"^postgresql://([^:@/]+)(:[^@]*)?@", rf"postgresql://\1:{password}@", url)


def run_cli(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()
