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
chunk's. The gate's transaction — its *window* — stays open until the chunk's transaction on the
target has committed, and within a lease (``lease``) across the lease's next chunks of the same
policy on the same target, for ``GATE_WINDOW_S`` at most: its fences and generation are taken
once for all of them. So a decision (a hold, a pause, an approval, the kill switch) either
commits before the window's fences were granted — then the window read its generation and
every chunk in it sees the decision in the mirror — or waits for the window's chunks to commit
first (at most the window's time and one chunk), as on one database (docs/fleet.md).
"""

from __future__ import annotations

import contextlib
import logging
import select
import sys
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, DatabaseError, Error, connection, connections, transaction

from core import locks
from core.models import AccountSeal
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion
from runs.engine.errors import sqlstate_of
from signatures.models import Signature
from targets import connections as C
from targets.models import DEFAULT

log = logging.getLogger(__name__)

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
        _lock_mirror(name)
        decisions = read_decisions()
        with C.on(name):
            write_decisions(decisions, generation)
    with _synced_lock:
        _synced[name] = generation
    return generation


class _Window:
    """One control-database transaction holding the decisions' fences shared for consecutive
    chunks of one policy on one target, in this thread."""

    def __init__(self, target: str, policy_id: int, control, generation: int, session) -> None:
        self.target, self.policy_id, self.control = target, policy_id, control
        self.generation = generation
        self.opened = time.monotonic()
        self.session = session  # this thread's control connection (a Django wrapper)

    def intact(self) -> bool:
        """Whether the control server has said nothing since the window's last statement. A
        session the server ends (terminated, restarted) releases its fences at once and sends
        its last message and end of stream; between chunks an open transaction gets no other
        word, so a look at the socket — no round trip — tells a window to trust no more."""
        try:
            socket = self.session.connection.pgconn.socket
            readable, _, _ = select.select([socket], [], [], 0)
        except Exception:  # noqa: BLE001 - closed or unusable: not intact
            return False
        return not readable

    def age(self) -> float:
        return time.monotonic() - self.opened


class _Local(threading.local):
    def __init__(self) -> None:
        self.window: _Window | None = None  # the open window, if any
        self.leases = 0  # depth of ``lease()`` blocks: windows outlive a chunk only inside one


_local = _Local()


def window_s() -> float:
    return float(settings.RETENTION.get("GATE_WINDOW_S", 1.0))


def _open(name: str, policy_id: int) -> _Window | None:
    """Take the fences shared on the control database and bring ``name``'s mirror to the
    generation read after they were granted; None when a decision (or another process's sync
    of this mirror) holds a lock longer than ``GATE_LOCK_TIMEOUT_MS``."""
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
            # a statement of its own: its snapshot is taken once the fences are granted
            generation = control_generation()
        except DatabaseError:
            control.__exit__(*sys.exc_info())
            return None
        session = connections[DEFAULT_DB_ALIAS]
    window = _Window(name, policy_id, control, generation, session)
    _local.window = window
    if _synced.get(name) == generation:
        return window
    try:
        if target_generation() != generation:
            with C.on(DEFAULT):
                _lock_mirror(name)
                decisions = read_decisions()
            write_decisions(decisions, generation)
    except DatabaseError as exc:
        release(sys.exc_info())
        if sqlstate_of(exc) == "55P03":  # another process's sync of this mirror, past its time
            return None
        raise
    with _synced_lock:
        _synced[name] = generation
    return window


def _lock_mirror(name: str) -> None:
    """In the control transaction in place: the mirror sync of target ``name``, one at a time.
    Each sync reads the decisions after it got the lock and writes them before the lock ends,
    so the writes follow the reads' order: a mirror never goes back to decisions read before
    the ones it holds (two processes syncing at once, one of them late by a chunk, would
    otherwise write older rows over newer ones)."""
    locks.xact_lock(locks.MIRROR, locks.int4(name))


def target_generation() -> int:
    """The generation the mirror in place (a target's ledger) was last synced to."""
    return control_generation()


def release(exc_info=None) -> bool:
    """End this thread's window, if one is open: commit its control transaction (its fences
    and reads, and any message a committed chunk sent to the control database's queue), so a
    decision waiting for the fences goes ahead; with ``exc_info`` (its own statement failed)
    roll it back. A control connection lost meanwhile has released the fences itself: nothing
    is left to end. Returns whether a window was open."""
    window, _local.window = _local.window, None
    if window is None:
        return False
    with C.on(DEFAULT):
        try:
            window.control.__exit__(*(exc_info or (None, None, None)))
        except Error as exc:  # the session is gone (``InterfaceError`` once Django closed it)
            log.warning("the gate's control transaction ended with an error: %s", exc)
            with contextlib.suppress(Exception):
                connection.close()
    return True


def pause(seconds: float) -> None:
    """Before this thread waits ``seconds`` between chunks (a policy's pace, the guard's duty
    cycle): keep the window only if it is still within its time afterwards."""
    window = _local.window
    if window is not None and window.age() + seconds >= window_s():
        release()


@contextlib.contextmanager
def lease() -> Iterator[None]:
    """A lease's drain: inside it a window outlives the chunk that opened it, for the next
    chunks of the same policy on the same target, until it is ``window_s()`` old; it ends
    with the block at the latest."""
    _local.leases += 1
    try:
        yield
    finally:
        _local.leases -= 1
        release()


@contextlib.contextmanager
def gate(policy_id: int) -> Iterator[bool]:
    """Around one chunk of a run on the target in place: yields True once the control
    database's fences are held shared and the target's mirror is at the decisions' generation
    read after they were granted, and holds them until the block (the chunk's transaction on
    the target) has ended — inside ``lease()``, across the next chunks of the same policy on
    the same target too, for ``window_s()`` at most: the window's fences and generation are
    taken once, the chunks after its first cost the control database nothing. Yields False
    when a decision holds a fence longer than ``GATE_LOCK_TIMEOUT_MS`` (try again shortly). On
    the control database itself it yields True at once: its chunks take the same fences in
    their own transaction."""
    name = C.current()
    if name == DEFAULT:
        yield True
        return
    window = _local.window
    if window is not None and (
        window.target != name
        or window.policy_id != policy_id
        or window.age() >= window_s()
        or not window.intact()
    ):
        release()
        window = None
    if window is None:
        window = _open(name, policy_id)
        if window is None:
            yield False
            return
    ended = False
    try:
        yield True
        ended = True
    finally:
        # the chunk's transaction has ended (or failed): the window goes on only inside a
        # lease, within its time, after a chunk that raised nothing
        if not ended or not _local.leases or window.age() >= window_s():
            release()


def forget() -> None:
    """Forget what this process knows of the mirrors (tests that rebuild a target)."""
    release()
    with _synced_lock:
        _synced.clear()
