"""A real least-privilege worker role (docs/least-privilege.sql): its grants, and
connections as that role."""

from __future__ import annotations

import re

import psycopg
from django.db import connection
from psycopg import sql

from tests.runs.conftest import ROOT, worker_env

SCRIPT = ROOT / "docs" / "least-privilege.sql"


def grant_statements(role: str, target: tuple[str, str]) -> list[sql.Composed]:
    """docs/least-privilege.sql with its psql variables bound as identifiers."""
    text = "\n".join(
        line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("--")
    )
    out = []
    for statement in filter(None, (s.strip() for s in text.split(";"))):
        template = (
            statement.replace(':"worker_role"', "{role}")
            .replace(':"DBNAME"', "{db}")
            .replace(":target", "{target}")
        )
        assert not re.search(r":\w|:\"", template), f"unbound psql variable in {statement!r}"
        out.append(
            sql.SQL(template).format(
                role=sql.Identifier(role),
                db=sql.Identifier(connection.settings_dict["NAME"]),
                target=sql.Identifier(*target),
            )
        )
    return out


def url_as(role: str, password: str) -> str:
    url = worker_env()["DATABASE_URL"]
    return re.sub(r"^postgresql://[^@/]*@", f"postgresql://{role}:{password}@", url)


def connect_as(role: str, password: str) -> psycopg.Connection:
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params.update(user=role, password=password, application_name="retention:least-privilege")
    return psycopg.connect(**params, autocommit=True)
