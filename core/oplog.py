"""The operator log: who changed what, when and why, hash-chained.

Every action function of every app (``core.accounts``, ``core.tokens``,
``retention.actions``, ``runs.actions``) writes its row with ``record_action`` in the
transaction of the change, and refuses with the one ``ActionError``; so the log lives at
the bottom layer, where all of them can reach it (docs/engine.md, "Layers and imports").
"""

from __future__ import annotations

import json
from contextvars import ContextVar, Token

from django.db import connection, transaction
from django.db.models import Max, TextField
from django.db.models.functions import Cast

from core import chain, locks
from core.models import AccountSeal, OperatorAction
from core.roles import SYSTEM_ACTORS
from signatures import proof
from signatures.models import Signature


class ActionError(ValueError):
    """A state change is refused in the current state; the message is one line.
    The one class for every action (``retention.actions`` and ``runs.actions`` raise it)."""


class StaleDecision(ActionError):
    """The target moved on since the caller looked at it (``check_decision``): a page
    rendered for an older state, or an API call whose ``If-Match`` names an older ETag."""


class NeedsAnotherPerson(ActionError):
    """Four eyes: the actor had a hand in what they try to decide (their own version, their
    own release request); another member of the role must decide."""


def require_reason(reason: str, what: str) -> str:
    """The reason stripped, or ActionError "<what> needs a reason"; every action that the
    design says needs a reason calls this, so the CLI and the pages get the same refusal."""
    reason = (reason or "").strip()
    if not reason:
        raise ActionError(f"{what} needs a reason")
    if "\x00" in reason:
        raise ActionError("the reason contains a NUL character")
    return reason


_channel: ContextVar[dict | None] = ContextVar("retention_channel", default=None)


def channel() -> dict:
    """Details every operator-action row of the current CLI command carries ({} elsewhere)."""
    return dict(_channel.get() or {})


def set_channel(via: dict | None) -> Token:
    """Say how the current command acts (``core.cli_identity``); ``reset_channel`` undoes it."""
    return _channel.set(via)


def reset_channel(token: Token) -> None:
    _channel.reset(token)


def decision_token(target) -> str:
    """What a control was rendered for: the target's state and the chain position of the
    latest operator action on it (``paused:42``). A form posts it back as ``expected``; the
    action refuses when the target has moved on since (``check_decision``), so a stale page
    never silently overwrites a newer decision."""
    seq = OperatorAction.objects.filter(
        target_type=target._meta.model_name, target_id=str(target.pk)
    ).aggregate(m=Max("chain_seq"))["m"]
    return f"{target.decision_state}:{seq or 0}"


def check_decision(target, expected: str | None, *, now_is: str) -> None:
    """Refuse (``ActionError``) when ``expected`` was posted and the target's decision token
    no longer matches it; call with the target's row locked. ``now_is`` describes the current
    state for the message."""
    if expected is not None and expected != decision_token(target):
        raise StaleDecision(
            f"changed since the page was loaded; now {now_is}. Nothing was changed: "
            "reload and decide again"
        )


ACTION_FIELDS = ("chain_seq", "at", "actor", "action", "target_type", "target_id", "reason")


def action_hash(row: dict, prev_hash: str) -> str:
    """An operator action's link: its fields and ``details_text``, PostgreSQL's own text of
    the ``details`` JSON (so the hash does not depend on how Python spells numbers)."""
    fields = {name: row[name] for name in ACTION_FIELDS}
    fields["details"] = row["details_text"]
    return chain.link_hash(fields, prev_hash)


def verify_operator_log(batch: int = 5000, *, after: tuple[int, str] | None = None):
    """Walk the operator-action chain in order, in constant memory (``after``: only the
    links after this one, which they must continue; ``chain.walk``)."""
    after = after or (0, chain.GENESIS)
    rows = chain.batched(
        OperatorAction.objects.annotate(details_text=Cast("details", TextField())),
        [*ACTION_FIELDS, "details_text", "prev_hash", "hash"],
        batch,
        after=after[0],
    )
    return chain.walk(
        rows,
        lambda row: action_hash(row, row["prev_hash"]),
        noun="operator action",
        gap="operator log gap",
        after=after,
    )


def is_person(actor) -> bool:
    """A person acts (a user object), not one of the product's own processes (a name)."""
    return hasattr(actor, "pk") and hasattr(actor, "username")


def sealed_identity(person) -> dict:
    """Who decides, as the signature carries it: id, username and the account's seal as it is
    now (``core.seals``). A person whose seal is missing cannot decide."""
    mac = AccountSeal.objects.filter(user_id=person.pk).values_list("mac", flat=True).first()
    if not mac:
        raise ActionError(f"{person.username}'s account is not sealed and cannot decide")
    return {"id": person.pk, "username": person.username, "seal": mac}


def subject_of(target) -> str:
    return f"{target._meta.model_name}:{target.pk}"


def sign_decision(person, kind: str, target, *, subject: str = "", **content) -> Signature:
    """Sign decision ``kind`` on ``target`` by ``person`` (in the caller's transaction), over
    ``content`` and the person's sealed identity (``signatures.proof``). Refused
    (``ActionError``, nothing written) in a process without the signing key."""
    try:
        return proof.sign(
            kind, subject or subject_of(target), {**content, "by": sealed_identity(person)}
        )
    except proof.SigningRefused as exc:
        raise ActionError(str(exc)) from None


def unsigned_actions(batch: int = 5000) -> list[str]:
    """Every operator-log row a person's action wrote whose signature is missing or does not
    verify (rows of the product's own processes are unsigned: they hold no signing key)."""
    out: list[str] = []
    last = 0
    while True:
        rows = list(
            OperatorAction.objects.filter(chain_seq__gt=last)
            .exclude(actor__in=SYSTEM_ACTORS)
            .order_by("chain_seq")
            .values_list("chain_seq", "actor", "action", "hash")[:batch]
        )
        if not rows:
            return out
        subjects = [f"operatoraction:{seq}" for seq, *_ in rows]
        found: dict[str, list[Signature]] = {}
        for signature in Signature.objects.filter(kind="oplog", subject__in=subjects):
            found.setdefault(signature.subject, []).append(signature)
        for seq, actor, action, hash_ in rows:
            subject = f"operatoraction:{seq}"
            _, reason = proof.check(
                "oplog", subject, {"hash": hash_, "actor": actor}, found.get(subject, [])
            )
            if reason:
                out.append(f"operator action #{seq} ({action} by {actor}): {reason}")
        last = rows[-1][0]


def record_action(actor, action: str, target, *, reason: str = "", **details) -> OperatorAction:
    """Write one operator-action row, chained; call inside the transaction of the change
    (it takes the operator-chain lock until that transaction commits). Within a CLI
    command the row also says so (``via: cli`` and the token, ``core.cli_identity``)."""
    actor_name = getattr(actor, "username", None) or str(actor)
    target_type = (
        target._meta.model_name if hasattr(target, "_meta") else str(type(target).__name__)
    )
    target_id = str(getattr(target, "pk", target))
    details = {**channel(), **details}
    with transaction.atomic():
        locks.xact_lock(locks.OPERATOR_CHAIN, 0)
        with connection.cursor() as cur:
            # after the lock, in its own statement: the head read must see every earlier commit
            cur.execute(
                "SELECT clock_timestamp(), %s::jsonb::text, (SELECT chain_seq FROM"
                " retention_operatoraction ORDER BY chain_seq DESC LIMIT 1), (SELECT hash"
                " FROM retention_operatoraction ORDER BY chain_seq DESC LIMIT 1)",
                [json.dumps(details)],
            )
            at, details_text, last_seq, last_hash = cur.fetchone()
        row = {
            "chain_seq": (last_seq or 0) + 1,
            "at": at,
            "actor": actor_name,
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "reason": reason,
            "details_text": details_text,
        }
        prev = last_hash or chain.GENESIS
        action_row = OperatorAction.objects.create(
            **{k: v for k, v in row.items() if k != "details_text"},
            details=details,
            prev_hash=prev,
            hash=action_hash(row, prev),
        )
        if is_person(actor):
            # a person's row is signed where the person was authenticated: a row written
            # with a database login alone has no signature (``unsigned_actions``)
            sign_decision(
                actor,
                "oplog",
                action_row,
                subject=f"operatoraction:{action_row.chain_seq}",
                hash=action_row.hash,
                actor=actor_name,
            )
        return action_row
