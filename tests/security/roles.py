"""Real database logins with the grants the product's own command gives them
(``retention grants apply``), and connections as those logins."""

from __future__ import annotations

import io
import re

import psycopg
from django.core.management import call_command
from django.db import connection

from tests.runs.conftest import worker_env


def apply_grants(kind: str, role: str, *targets: str) -> str:
    """What a deployment does: ``retention grants apply --KIND ROLE --target …`` (the
    product's own command, with this connection's — the owner's — login)."""
    out = io.StringIO()
    args = ["grants", "apply", f"--{kind}", role]
    for target in targets:
        args += ["--target", target]
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def url_as(role: str, password: str) -> str:
    url = worker_env()["DATABASE_URL"]
    return re.sub(r"^postgresql://[^@/]*@", f"postgresql://{role}:{password}@", url)


def connect_as(role: str, password: str) -> psycopg.Connection:
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params.update(user=role, password=password, application_name="retention:least-privilege")
    return psycopg.connect(**params, autocommit=True)
