"""Connections to targets, made at run time from each process's own environment.

A target's connection string is read from the variable or file its registry row names, in the
process that connects, and kept only in that process's memory: never in the control database,
on a page, in an answer or a log line (errors name the variable or file, never its value).

``on(NAME)`` runs a block with Django's default connection *being* that target's, in this thread
only: every query the engine makes — the ORM's and its raw SQL alike — goes to the target, so a
chunk's DELETE, its audit row and its chunk state commit in one transaction there, unchanged
code. ``on("default")`` is the control database. Connections to targets are not Django aliases
(``connections.settings`` never lists them): each thread keeps its own wrapper per target, closed
by ``close_all``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper

from core.env import ConfigError, database_from_url, redact
from targets.models import DEFAULT, NAME_PATTERN

CONNECT_TIMEOUT_S = 5
GROUP_PREFIX = "group:"


class TargetError(Exception):
    """One line for a person: which target, what is wrong, never the connection string."""


class _Local(threading.local):
    def __init__(self) -> None:
        self.stack: list[str] = []  # the targets entered in this thread, innermost last
        self.control = None  # this thread's control wrapper while a target's is in place
        self.wrappers: dict[str, tuple[str, DatabaseWrapper]] = {}  # name -> (dsn, wrapper)
        self.separate: dict[str, tuple[str, DatabaseWrapper]] = {}  # the same, ``separate``'s


_local = _Local()


def current() -> str:
    return _local.stack[-1] if _local.stack else DEFAULT


def control_connection():
    """This thread's connection to the control database, whichever target is in place."""
    return _local.control if _local.stack else connections[DEFAULT_DB_ALIAS]


def valid_name(name: str) -> bool:
    return bool(re.match(NAME_PATTERN, name or ""))


# -- the connection string ------------------------------------------------------------------


def reference_of(name: str) -> tuple[str, str, str]:
    """(dsn_env, dsn_file, group) of a registered target, read from the control database."""
    with control_connection().cursor() as cur:
        cur.execute('SELECT dsn_env, dsn_file, "group" FROM targets_target WHERE name = %s', [name])
        row = cur.fetchone()
    if row is None:
        raise TargetError(f"no target {name!r} (retention target list)")
    return row


def dsn_from(dsn_env: str, dsn_file: str, *, name: str) -> str:
    """The connection string the reference names, in this process; one clear line otherwise."""
    if dsn_env:
        value = os.environ.get(dsn_env, "").strip()
        if not value:
            raise TargetError(f"target {name}: environment variable {dsn_env} is not set here")
        return value
    try:
        value = Path(dsn_file).read_text().strip()
    except OSError as exc:
        raise TargetError(f"target {name}: cannot read {dsn_file}: {exc.strerror}") from None
    if not value:
        raise TargetError(f"target {name}: {dsn_file} is empty")
    return value


def settings_for(name: str, dsn: str) -> dict:
    """The control database's connection settings (search path, session settings, timeouts)
    with the target's server, database and login."""
    try:
        entry = database_from_url(f"target {name}", dsn)
    except ConfigError as exc:
        raise TargetError(str(exc)) from None
    base = copy.deepcopy(connections.settings[DEFAULT_DB_ALIAS])
    options = {
        k: v for k, v in base["OPTIONS"].items() if k in ("options", "application_name", "pool")
    }
    options.update(entry["OPTIONS"])
    options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    base.update({k: entry[k] for k in ("NAME", "USER", "PASSWORD", "HOST", "PORT")})
    base["OPTIONS"] = options
    base["TEST"] = {}
    return base


def probe(dsn: str, *, name: str) -> None:
    """Connect once and run ``SELECT 1``; ``TargetError`` with the server's reason (never the
    connection string) when that fails."""
    try:
        entry = database_from_url(f"target {name}", dsn)
    except ConfigError as exc:
        raise TargetError(str(exc)) from None
    try:
        with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise TargetError(f"target {name}: cannot connect: {first_line(exc, entry)}") from None


def first_line(exc: BaseException, entry: dict | None = None) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    password = (entry or {}).get("PASSWORD")
    if password:
        text = text.replace(password, "***")
    return redact(text)


# -- being on a target ----------------------------------------------------------------------


def _wrapper(name: str, dsn: str | None = None) -> DatabaseWrapper:
    if dsn is None:
        dsn_env, dsn_file, _group = reference_of(name)
        dsn = dsn_from(dsn_env, dsn_file, name=name)
    known = _local.wrappers.get(name)
    if known is not None and known[0] == dsn:
        return known[1]
    if known is not None:
        known[1].close()
    wrapper = DatabaseWrapper(settings_for(name, dsn), alias=f"target:{name}")
    _local.wrappers[name] = (dsn, wrapper)
    return wrapper


@contextlib.contextmanager
def on(name: str, *, dsn: str | None = None) -> Iterator[None]:
    """Run the block with Django's default connection being target ``name``'s (this thread).
    ``dsn``: its connection string, already read from its reference (``dsn_from``) by the
    caller, so that this thread need not read the registry."""
    if name == current():
        yield
        return
    if name == DEFAULT:
        wrapper = control_connection()
    else:
        wrapper = _wrapper(name, dsn)
    if not _local.stack:
        _local.control = connections[DEFAULT_DB_ALIAS]
    previous = connections[DEFAULT_DB_ALIAS]
    _local.stack.append(name)
    connections[DEFAULT_DB_ALIAS] = wrapper
    try:
        yield
    finally:
        connections[DEFAULT_DB_ALIAS] = previous
        _local.stack.pop()
        if not _local.stack:
            _local.control = None


def separate(name: str) -> DatabaseWrapper:
    """This thread's own connection to target ``name`` (``default``: the control database),
    apart from the one ``on`` puts in place: its transactions commit or roll back on their own,
    whatever a chunk's transaction on the same database does (an archive's table is written
    and committed there before the chunk's DELETE commits). Closed by ``close_all``."""
    known = _local.separate.get(name)
    if known is not None and known[1].connection is not None and not known[1].connection.closed:
        # connected: its string was read when it connected (a chunk archiving into a table of
        # a target costs the control database no registry read)
        return known[1]
    if name == DEFAULT:
        dsn, settings = "", copy.deepcopy(connections.settings[DEFAULT_DB_ALIAS])
    else:
        dsn_env, dsn_file, _group = reference_of(name)
        dsn = dsn_from(dsn_env, dsn_file, name=name)
        settings = None
    if known is not None and known[0] == dsn:
        return known[1]
    if known is not None:
        known[1].close()
    wrapper = DatabaseWrapper(settings or settings_for(name, dsn), alias=f"separate:{name}")
    _local.separate[name] = (dsn, wrapper)
    return wrapper


def carry(func: Callable) -> Callable:
    """``func`` to run in another thread on the target in place here, with the connection
    string this thread read: the other thread neither reads the registry nor opens a control
    connection for it."""
    name = current()
    known = _local.wrappers.get(name)
    dsn = known[0] if name != DEFAULT and known is not None else None

    def run(*args, **kwargs):
        with on(name, dsn=dsn):
            try:
                return func(*args, **kwargs)
            finally:
                if name != DEFAULT:
                    close_all()

    return run


def has_session(name: str) -> bool:
    """Whether this thread holds an open session to target ``name`` (one a failure may have
    found lost, where a second attempt opens a new one)."""
    known = _local.wrappers.get(name)
    return known is not None and known[1].connection is not None


def close_all() -> None:
    """Close this thread's connections to targets."""
    for _dsn, wrapper in [*_local.wrappers.values(), *_local.separate.values()]:
        with contextlib.suppress(Exception):
            wrapper.close()
    _local.wrappers.clear()
    _local.separate.clear()


def has_ledger() -> bool:
    """Whether the database in place holds the product's ledger (``retention target migrate``)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT to_regclass('targets_generation') IS NOT NULL"
            " AND to_regclass('runs_auditrecord') IS NOT NULL"
        )
        return bool(cur.fetchone()[0])


# -- which targets ---------------------------------------------------------------------------


def resolve(names) -> list[str]:
    """A policy's ``targets`` (names and ``group:LABEL``) as target names, in order, each once;
    a group's members are read now, so a target that joins the group later is included."""
    out: list[str] = []
    for item in names or (DEFAULT,):
        if item.startswith(GROUP_PREFIX):
            with control_connection().cursor() as cur:
                cur.execute(
                    'SELECT name FROM targets_target WHERE "group" = %s ORDER BY name',
                    [item[len(GROUP_PREFIX) :]],
                )
                members = [row[0] for row in cur.fetchall()]
        else:
            members = [item]
        out.extend(m for m in members if m not in out)
    return out


def targets_of(policy, *, version=None) -> list[str]:
    """The targets ``policy``'s approved version names, resolved now (``["default"]`` without
    one, or when it names none). ``version``: that version as the caller read it (read here
    when not given)."""
    version = version or policy.approved_version
    return resolve(version.parsed.targets if version is not None else (DEFAULT,))


def all_names() -> list[str]:
    with control_connection().cursor() as cur:
        cur.execute("SELECT name FROM targets_target ORDER BY name")
        return [DEFAULT] + [row[0] for row in cur.fetchall()]


def note_reachable(name: str, error: BaseException | None) -> None:
    """Record on the registry row (control database, autocommit) whether ``name`` answered:
    the pages and ``status`` read it without connecting."""
    if name == DEFAULT:
        return
    with control_connection().cursor() as cur:
        if error is None:
            cur.execute(
                "UPDATE targets_target SET unreachable_since = NULL, unreachable_reason = ''"
                " WHERE name = %s AND unreachable_since IS NOT NULL",
                [name],
            )
        else:
            cur.execute(
                "UPDATE targets_target SET unreachable_since = coalesce(unreachable_since, now()),"
                " unreachable_reason = %s WHERE name = %s",
                [why_unusable(error), name],
            )


def why_unusable(error: BaseException) -> str:
    """One line for a target that cannot be used: its error's first line, said to be a
    read-only database (SQLSTATE 25006) or a missing grant (42501) where it is one."""
    codes = {getattr(e, "sqlstate", None) for e in (error, error.__cause__)}
    if "25006" in codes:
        return f"read-only (a replica after a fail-over?): {first_line(error)}"
    if "42501" in codes:
        return f"the login lacks a grant (`retention grants check`): {first_line(error)}"
    return first_line(error)
