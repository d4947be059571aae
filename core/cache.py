"""A PostgreSQL cache that stores JSON, never pickles.

Django's ``DatabaseCache`` unpickles every value it reads, so whoever can write its table
can run code in every process that reads it. This backend keeps Django's table layout
(``createcachetable`` creates it: ``cache_key`` primary key, ``value`` text, ``expires``)
and stores values as JSON: what a reader gets back is only ever strings, numbers, booleans,
None, lists, dicts and datetimes. A value that is not such JSON (a planted pickle, say) reads
as a miss. Writing a value of any other type raises ``TypeError``.

Expired rows are never returned (the expiry is compared in SQL) and are deleted every
``CULL_EVERY`` writes of a process.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, date, datetime

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.db import BaseDatabaseCache
from django.db import DatabaseError, connections, router
from psycopg import sql

log = logging.getLogger(__name__)

CULL_EVERY = 100
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)  # Django's own "no expiry"
_UPSERT = (
    "INSERT INTO {table} (cache_key, value, expires) VALUES (%s, %s, %s)"
    " ON CONFLICT (cache_key) DO UPDATE SET value = EXCLUDED.value, expires = EXCLUDED.expires"
)


# many keys in one statement, in key order (two writers of the same keys never deadlock)
_UPSERT_MANY = (
    "INSERT INTO {table} (cache_key, value, expires)"
    " SELECT k, v, e FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) AS t(k, v, e)"
    " ORDER BY k"
    " ON CONFLICT (cache_key) DO UPDATE SET value = EXCLUDED.value, expires = EXCLUDED.expires"
)


def _encode(value):
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    raise TypeError(f"the cache stores JSON values only, not {type(value).__name__}")


def _decode(obj: dict):
    if len(obj) == 1:
        if isinstance(obj.get("$datetime"), str):
            return datetime.fromisoformat(obj["$datetime"])
        if isinstance(obj.get("$date"), str):
            return date.fromisoformat(obj["$date"])
    return obj


def dumps(value) -> str:
    return json.dumps(value, default=_encode, separators=(",", ":"))


def loads(text: str):
    return json.loads(text, object_hook=_decode)


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)


class JSONDatabaseCache(BaseDatabaseCache):
    _writes = 0

    def _run(self, statement: str, params: list, *, write: bool) -> tuple[int, list]:
        alias = (router.db_for_write if write else router.db_for_read)(self.cache_model_class)
        query = sql.SQL(statement).format(table=sql.Identifier(self._table))
        try:
            with connections[alias].cursor() as cur:
                cur.execute(query.as_string(cur.connection), params)
                rows = cur.fetchall() if cur.description else []
                return cur.rowcount, rows
        except DatabaseError as exc:
            if not write or _sqlstate(exc) != "25006" or connections[alias].in_atomic_block:
                raise
            # a database that accepts no writes now (a target after a fail-over to a replica):
            # the value is only not remembered; whoever asked for it still gets it
            log.info("cache not written: the database is read-only")
            return 0, []

    def _expiry(self, timeout) -> datetime:
        at = self.get_backend_timeout(timeout)
        return FOREVER if at is None else datetime.fromtimestamp(at, tz=UTC)

    def get(self, key, default=None, version=None):
        return self.get_many([key], version).get(key, default)

    def get_many(self, keys, version=None):
        key_map = {self.make_and_validate_key(key, version=version): key for key in keys}
        if not key_map:
            return {}
        _, rows = self._run(
            "SELECT cache_key, value FROM {table} WHERE cache_key = ANY(%s) AND expires > now()",
            [list(key_map)],
            write=False,
        )
        result = {}
        for key, text in rows:
            try:
                result[key_map[key]] = loads(text)
            except ValueError:
                log.warning("cache entry %r is not JSON; ignored", key)
        return result

    def has_key(self, key, version=None):
        return bool(self.get_many([key], version))

    def _write(self, key, value, timeout, version, *, only_if_absent: bool) -> bool:
        key = self.make_and_validate_key(key, version=version)
        statement = _UPSERT + " WHERE {table}.expires <= now()" if only_if_absent else _UPSERT
        count, _ = self._run(statement, [key, dumps(value), self._expiry(timeout)], write=True)
        JSONDatabaseCache._writes += 1
        if JSONDatabaseCache._writes % CULL_EVERY == 0:
            self._run("DELETE FROM {table} WHERE expires <= now()", [], write=True)
        return count == 1

    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        self._write(key, value, timeout, version, only_if_absent=False)

    def set_many(self, data, timeout=DEFAULT_TIMEOUT, version=None):
        """Every key in one statement (Django's default writes them one by one)."""
        if not data:
            return []
        rows = sorted(
            (self.make_and_validate_key(key, version=version), dumps(value))
            for key, value in data.items()
        )
        expires = self._expiry(timeout)
        self._run(
            _UPSERT_MANY,
            [[k for k, _ in rows], [v for _, v in rows], [expires] * len(rows)],
            write=True,
        )
        JSONDatabaseCache._writes += 1
        if JSONDatabaseCache._writes % CULL_EVERY == 0:
            self._run("DELETE FROM {table} WHERE expires <= now()", [], write=True)
        return []

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        return self._write(key, value, timeout, version, only_if_absent=True)

    def touch(self, key, timeout=DEFAULT_TIMEOUT, version=None):
        key = self.make_and_validate_key(key, version=version)
        count, _ = self._run(
            "UPDATE {table} SET expires = %s WHERE cache_key = %s AND expires > now()",
            [self._expiry(timeout), key],
            write=True,
        )
        return count == 1

    def delete(self, key, version=None):
        return self.delete_many([key], version) > 0

    def delete_many(self, keys, version=None):
        keys = [self.make_and_validate_key(key, version=version) for key in keys]
        if not keys:
            return 0
        count, _ = self._run("DELETE FROM {table} WHERE cache_key = ANY(%s)", [keys], write=True)
        return count

    def clear(self):
        self._run("DELETE FROM {table}", [], write=True)
