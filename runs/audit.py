"""The audit hash chain: each record's hash covers its content and the previous hash,
so an edit, a deletion or a gap in ``chain_seq`` is detectable."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.db import connection

from core import locks

GENESIS = "0" * 64

_FIELDS = (
    "chain_seq", "chunk_id", "run_id", "policy_version_id", "policy_slug", "table_name", "cutoff",
    "tenant", "key_from", "key_to", "attempt", "worker_host", "worker_pid", "rows_deleted",
    "started_at", "committed_at", "outcome",
)  # fmt: skip


def record_hash(values: dict, prev_hash: str) -> str:
    parts = [prev_hash]
    for name in _FIELDS:
        value = values[name]
        parts.append(value.isoformat() if hasattr(value, "isoformat") else str(value))
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def append(**values) -> dict:
    """Append one record to the chain inside the caller's transaction.

    Takes the chain lock until commit, so records are chained in commit order
    and ``chain_seq`` has no gaps.
    """
    from runs.models import AuditRecord

    locks.xact_lock(locks.AUDIT_CHAIN, 0)
    with connection.cursor() as cur:
        # after the lock, in its own statement: the head read must see every earlier commit
        cur.execute(
            "SELECT clock_timestamp(), (SELECT chain_seq FROM runs_auditrecord ORDER BY chain_seq DESC LIMIT 1),"
            " (SELECT hash FROM runs_auditrecord ORDER BY chain_seq DESC LIMIT 1)"
        )
        committed_at, last_seq, last_hash = cur.fetchone()
    seq = (last_seq + 1) if last_seq else 1
    prev = last_hash or GENESIS
    values = {**values, "chain_seq": seq, "committed_at": committed_at}
    values["hash"] = record_hash(values, prev)
    values["prev_hash"] = prev
    AuditRecord.objects.create(**values)
    return values


@dataclass
class ChainReport:
    records: int
    head: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chain(batch: int = 5000) -> ChainReport:
    """Walk the whole chain in order, in constant memory."""
    from runs.models import AuditRecord

    problems: list[str] = []
    prev = GENESIS
    expected_seq = 1
    count = 0
    fields = [*(f for f in _FIELDS), "prev_hash", "hash"]
    last_seq = 0
    while True:
        rows = list(
            AuditRecord.objects.filter(chain_seq__gt=last_seq)
            .order_by("chain_seq")
            .values(*fields)[:batch]
        )
        if not rows:
            break
        for row in rows:
            count += 1
            if row["chain_seq"] != expected_seq:
                problems.append(f"gap: expected record {expected_seq}, found {row['chain_seq']}")
                expected_seq = row["chain_seq"]
            if row["prev_hash"] != prev:
                problems.append(f"record {row['chain_seq']}: previous hash does not match")
            if record_hash(row, row["prev_hash"]) != row["hash"]:
                problems.append(f"record {row['chain_seq']}: content does not match its hash")
            prev = row["hash"]
            expected_seq += 1
            last_seq = row["chain_seq"]
            if len(problems) > 100:
                return ChainReport(count, prev, problems)
    return ChainReport(count, prev, problems)
