"""Classify database errors by SQLSTATE: retry later, split, or dead-letter."""

from __future__ import annotations

from dataclasses import dataclass

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
}
_TRANSIENT_CLASSES = {"08": "connection failure"}
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
    if not code:
        # No SQLSTATE: the connection broke (psycopg OperationalError) or the message was bad.
        from django.db import InterfaceError, OperationalError

        if isinstance(exc, OperationalError | InterfaceError):
            return Classified(TRANSIENT, "", "connection lost")
        return Classified(PERMANENT, "", type(exc).__name__)
    return Classified(TRANSIENT, code, f"database error {code}")
