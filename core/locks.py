"""PostgreSQL advisory lock keys: every coordination in the product is a Postgres lock,
so it holds across processes and hosts and a crash releases it.

Keys are two int4s: (namespace, id). Transaction-level locks (``*_xact_*``) end
with the transaction that took them.
"""

from __future__ import annotations

import zlib

from django.db import connection

# namespaces (first int4 of the key)
HOLDS = 0x52520001  # legal-hold fence: placing a hold takes it exclusive, every chunk shared
RECONCILER = 0x52520002  # one reconciler pass at a time
SAMPLER = 0x52520003  # one guard sampler at a time
AUDIT_CHAIN = 0x52520004  # appending to the audit hash chain
CEILING_GLOBAL = 0x52520010
CEILING_POLICY = 0x52520011
CEILING_TENANT = 0x52520012
PLANNER = 0x52520020  # one planner per run


def int4(text: str) -> int:
    """A stable signed 32-bit number for ``text`` (crc32), for keys built from names."""
    value = zlib.crc32(text.encode())
    return value - (1 << 32) if value >= (1 << 31) else value


def xact_lock(namespace: int, key: int, *, shared: bool = False) -> None:
    fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cur:
        cur.execute(f"SELECT {fn}(%s, %s)", [namespace, key])  # noqa: S608 - fixed function names


def try_xact_lock(namespace: int, key: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [namespace, key])
        return bool(cur.fetchone()[0])


def hold_fence(*, exclusive: bool) -> None:
    """Order legal holds against deletions (design invariant 5).

    A chunk transaction takes the fence shared before its DELETE; placing a hold takes it
    exclusive. So a hold commits either before a DELETE's snapshot (the DELETE sees it) or
    after that chunk committed — a hold is effective for every deletion committed after it.
    """
    xact_lock(HOLDS, 0, shared=not exclusive)
