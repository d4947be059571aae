"""Failures of the engine: classify database errors by SQLSTATE (retry later, split, or
dead-letter), the back-off between tries, and the dead letter a person decides on."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

from runs.models import Chunk, DeadLetter, Run

HOST = socket.gethostname()

TRANSIENT = "transient"
PERMANENT = "permanent"

# Retried with backoff. Statement timeouts also split the chunk.
_TRANSIENT_CODES = {
    "55P03": "lock timeout",
    "57014": "statement timeout",
    "40001": "serialization failure",
    "40P01": "deadlock",
    "57P01": "server shutting down",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now",
    "53300": "too many connections",
    "53100": "disk full",
    "53200": "out of memory",
    "58000": "system error",
    "25006": "database is read-only",
}
_TRANSIENT_CLASSES = {"08": "connection failure"}
READ_ONLY = "25006"  # read_only_sql_transaction: see connection_lost
# Never retried: a person must look.
_PERMANENT_CODES = {
    "42P01": "undefined table",
    "42703": "undefined column",
    "23503": "foreign key restricts the delete",
    "23001": "foreign key restricts the delete (ON DELETE RESTRICT)",
    "42501": "insufficient privilege",
    "42883": "undefined function",
    "42804": "datatype mismatch",
}
_PERMANENT_CLASSES = {
    "22": "data exception",
    "42": "syntax or access rule",
    "23": "integrity constraint",
    "54": "program limit exceeded",
}


@dataclass(frozen=True)
class Classified:
    kind: str  # TRANSIENT or PERMANENT
    sqlstate: str
    label: str
    split: bool = False


def sqlstate_of(exc: BaseException) -> str:
    for candidate in (exc, getattr(exc, "__cause__", None)):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if code:
            return code
    return ""


def classify(exc: BaseException) -> Classified:
    code = sqlstate_of(exc)
    if code in _TRANSIENT_CODES:
        return Classified(TRANSIENT, code, _TRANSIENT_CODES[code], split=code == "57014")
    if code in _PERMANENT_CODES:
        return Classified(PERMANENT, code, _PERMANENT_CODES[code])
    if code[:2] in _TRANSIENT_CLASSES:
        return Classified(TRANSIENT, code, _TRANSIENT_CLASSES[code[:2]])
    if code[:2] in _PERMANENT_CLASSES:
        return Classified(PERMANENT, code, _PERMANENT_CLASSES[code[:2]])
    if not code and isinstance(exc, OSError):  # the archive's directory: read-only, full, gone
        return Classified(TRANSIENT, "", f"archive destination: {exc.strerror or exc}")
    if not code:
        # No SQLSTATE: the connection broke (psycopg OperationalError) or the message was bad.
        from django.db import InterfaceError, OperationalError

        if isinstance(exc, OperationalError | InterfaceError):
            return Classified(TRANSIENT, "", "connection lost")
        return Classified(PERMANENT, "", type(exc).__name__)
    return Classified(TRANSIENT, code, f"database error {code}")


def connection_lost(exc: BaseException) -> bool:
    """The database itself cannot be used, whatever the chunk or the run: the connection
    failed (no SQLSTATE from the server, or class 08), or the database no longer accepts
    writes (25006: a replica after a fail-over, or ``default_transaction_read_only``). The
    work stops where it stands, nothing is recorded against the run, and it resumes when the
    database is usable again."""
    cls = classify(exc)
    return (
        cls.label == "connection lost" or cls.sqlstate.startswith("08") or cls.sqlstate == READ_ONLY
    )


def backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2 ** max(0, attempts - 1)))) + base / 2


def dead_letter(
    *,
    chunk: Chunk | None,
    run: Run | None,
    error_class: str,
    sqlstate: str,
    message: str,
    attempts: int,
    extra: dict | None = None,
) -> DeadLetter:
    """Record a dead letter with the whole context an operator needs."""
    context: dict = dict(extra or {})
    if run is not None:
        spec = run.policy_version.parsed
        context.update(
            policy=spec.slug,
            policy_version=run.policy_version.number,
            run=run.run_key,
            table=spec.qualified_table,
            cutoff=run.cutoff.isoformat(),
        )
    if chunk is not None:
        context.update(
            tenant=chunk.tenant, key_from=chunk.key_from, key_to=chunk.key_to, chunk=chunk.pk,
            interval=chunk.interval,
        )  # fmt: skip
    context.update(sqlstate=sqlstate, attempts=attempts, host=HOST, pid=os.getpid())
    return DeadLetter.objects.create(
        chunk=chunk, run=run, error_class=error_class, sqlstate=sqlstate, message=message,
        context=context, attempts=attempts,
    )  # fmt: skip
