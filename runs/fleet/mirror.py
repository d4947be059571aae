"""The decisions a target's chunks obey, and the order that keeps them effective.

Every target's ledger holds a mirror of the control database's decision rows — policies, their
versions, legal holds, the kill switch, the signatures of those decisions (and the users the
versions name, without passwords) —
so a chunk's DELETE there is the same statement as on the control database: its hold test and
its admission read tables of the same transaction.

The mirror is not trusted on its own. Each chunk on a target runs inside a *gate* on the control
database (``gate``): a transaction there takes the global fence and the policy's fence shared —
exactly the fences a decision takes exclusive — and reads the decisions' generation (bumped by a
trigger in the deciding transaction, ``targets/migrations/0002``). When the target's mirror is
not at that generation it is synced first, in a target transaction that commits before the
chunk's. The gate stays open until the chunk's transaction on the target has committed, so a
decision (a hold, a pause, an approval, the kill switch) either commits before the gate's fences
were granted — then the gate sees its generation and the chunk's DELETE sees the decision in
the mirror — or waits for the chunk to commit first, as on one database (docs/fleet.md).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from core import locks
from core.models import AccountSeal
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion
from signatures.models import Signature
from targets import connections as C
from targets.models import DEFAULT

GATE_LOCK_TIMEOUT_MS = 5000

_synced: dict[str, int] = {}  # this process: target -> the generation its mirror was synced to
_synced_lock = threading.Lock()


def _rows(model) -> list[dict]:
    return list(model.objects.order_by("pk").values())


def read_decisions() -> dict:
    """The rows to mirror, read from the database in place (the control database)."""
    versions = _rows(PolicyVersion)
    # every person, without a password, and their seals: the versions name them, and a
    # person's action on a target (a trigger, a pause) is signed there with the sealed identity
    users = list(User.objects.order_by("pk").values("id", "username"))
    return {
        "users": users,
        "policies": _rows(Policy),
        "versions": versions,
        "holds": _rows(LegalHold),
        "kill": _rows(KillSwitch),
        # the signatures that vouch for approvals and releases: the worker verifies them
        # (``retention.decisions``) on the target as on the control database
        "signatures": _rows(Signature),
        "seals": list(AccountSeal.objects.order_by("pk").values("user_id", "mac")),
    }


def _upsert(model, rows: list[dict], *, key: str = "id") -> None:
    if not rows:
        return
    fields = [f.attname for f in model._meta.concrete_fields if f.attname != key]
    objs = [model(**row) for row in rows]
    model.objects.bulk_create(
        objs, update_conflicts=True, unique_fields=[key], update_fields=fields
    )


def _add_signatures(rows: list[dict]) -> None:
    """The control database's signatures the target lacks, each once (by its kind, subject and
    signature: they verify themselves), under the target's own ids — the target's own
    signatures (its people's actions there) keep theirs."""
    have = set(Signature.objects.values_list("kind", "subject", "signature"))
    new = [
        Signature(**{k: v for k, v in row.items() if k != "id"})
        for row in rows
        if (row["kind"], row["subject"], row["signature"]) not in have
    ]
    Signature.objects.bulk_create(new)


def write_decisions(decisions: dict, generation: int) -> None:
    """Write ``decisions`` into the ledger in place (a target's), at ``generation``."""
    with transaction.atomic():
        # the fences of the target's own chunks: none is between its admission and COMMIT
        locks.xact_lock(locks.HOLDS, 0)
        users = [{**u, "password": "!", "is_active": False} for u in decisions["users"]]
        if users:
            User.objects.bulk_create(
                [User(**u) for u in users],
                update_conflicts=True,
                unique_fields=["id"],
                update_fields=["username", "password", "is_active"],
            )
        _upsert(Policy, decisions["policies"])
        _upsert(PolicyVersion, decisions["versions"])
        _upsert(LegalHold, decisions["holds"])
        _upsert(KillSwitch, decisions["kill"], key="name")
        _upsert(AccountSeal, decisions["seals"], key="user_id")
        _add_signatures(decisions["signatures"])
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO targets_generation (id, generation) VALUES (1, %s)"
                " ON CONFLICT (id) DO UPDATE SET generation = EXCLUDED.generation",
                [generation],
            )


def control_generation() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT generation FROM targets_generation WHERE id = 1")
        row = cur.fetchone()
    return row[0] if row else 0


def sync(name: str) -> int:
    """Bring target ``name``'s mirror up to the control database's decisions now (outside any
    chunk: before a trigger creates a run there). Returns the generation."""
    with C.on(DEFAULT), transaction.atomic():
        locks.xact_lock(locks.HOLDS, 0, shared=True)
        generation = control_generation()
        decisions = read_decisions()
        with C.on(name):
            write_decisions(decisions, generation)
    with _synced_lock:
        _synced[name] = generation
    return generation


@contextlib.contextmanager
def gate(policy_id: int) -> Iterator[bool]:
    """Around one chunk of a run on the target in place: yields True once the control
    database's fences are held shared and the target's mirror is at the decisions' generation,
    and holds them until the block (the chunk's transaction on the target) has ended. Yields
    False when a decision holds a fence longer than ``GATE_LOCK_TIMEOUT_MS`` (try again
    shortly). On the control database itself it yields True at once: its chunks take the same
    fences in their own transaction."""
    name = C.current()
    if name == DEFAULT:
        yield True
        return
    with C.on(DEFAULT):
        control = transaction.atomic()
        control.__enter__()
        try:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT set_config('lock_timeout', %s, true),"
                    " pg_advisory_xact_lock_shared(%s, 0), pg_advisory_xact_lock_shared(%s, %s)",
                    [f"{GATE_LOCK_TIMEOUT_MS}ms", locks.HOLDS, locks.POLICY_FENCE, policy_id],
                )
            generation = control_generation()
            stale = _synced.get(name) != generation
            decisions = read_decisions() if stale else None
        except DatabaseError:
            control.__exit__(*sys.exc_info())
            yield False
            return
    try:
        if decisions is not None:
            write_decisions(decisions, generation)
            with _synced_lock:
                _synced[name] = generation
        yield True
    finally:
        with C.on(DEFAULT):
            control.__exit__(*sys.exc_info())


def forget() -> None:
    """Forget what this process knows of the mirrors (tests that rebuild a target)."""
    with _synced_lock:
        _synced.clear()
