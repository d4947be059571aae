"""PostgreSQL advisory lock keys: every coordination in the product is a Postgres lock,
so it holds across processes and hosts and a crash releases it.

Keys are two int4s: (namespace, id). Transaction-level locks (``*_xact_*``) end
with the transaction that took them.
"""

from __future__ import annotations

import zlib

from django.db import connection

# namespaces (first int4 of the key)
HOLDS = 0x52520001  # the global fence (legal holds, the kill switch): decisions exclusive, chunks shared
RECONCILER = 0x52520002  # one reconciler pass at a time
SAMPLER = 0x52520003  # one guard sampler at a time
PROBER = 0x52520006  # one guard sampler thread probes between samples (a session lock)
AUDIT_CHAIN = 0x52520004  # appending to the audit hash chain
OPERATOR_CHAIN = 0x52520005  # appending to the operator-action chain
CEILING_GLOBAL = 0x52520010
CEILING_POLICY = 0x52520011
CEILING_TENANT = 0x52520012
PLANNER = 0x52520020  # one planner per run
READ_ABOVE = (
    0x52520022  # per run: one session reads above its pass's last key (``reconciler.read_above``)
)
FINISHER = (
    0x52520021  # the session concluding a run's pass (verifying it), for idle drains to wait on
)
POLICY_FENCE = (
    0x52520030  # per-policy fence (approval, pause, cancel): decisions exclusive, chunks shared
)
MIRROR = (
    0x52520031  # per target (``int4(name)``), on the control database: one mirror sync at a time
)


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


def decision_fence(policy_id: int | None = None) -> None:
    """Order an operator decision against chunk transactions in flight (design invariant 6).

    Every chunk transaction takes the global fence and its policy's fence shared in its first
    statement and reads what admission depends on (kill switch, run and policy state, approved
    version) in a later one. A decision takes the fence exclusive before it changes any of that,
    so it waits for the chunks already past their fence to commit, and a chunk that starts after
    it sees the decision. ``None``: the global fence (kill switch, holds on all policies) — it
    waits for every chunk; a policy's fence (approving a version, pausing or cancelling) waits
    only for that policy's chunks. A chunk queued behind a waiting decision gives up after its
    policy's lock timeout and is retried; the decision itself waits at most one chunk.

    Take it before any row lock: a chunk in flight takes key-share locks on its run and version
    (the audit row's foreign keys), so a decision holding those rows while waiting here would
    deadlock with it."""
    if policy_id is None:
        xact_lock(HOLDS, 0)
    else:
        xact_lock(POLICY_FENCE, policy_id)


def hold_fence(*, exclusive: bool) -> None:
    """Order legal holds against deletions (design invariant 5).

    A chunk transaction takes the fence shared before its DELETE; placing a hold takes it
    exclusive. So a hold commits either before a DELETE's snapshot (the DELETE sees it) or
    after that chunk committed — a hold is effective for every deletion committed after it.
    """
    xact_lock(HOLDS, 0, shared=not exclusive)
