"""Hash chains: each link's hash covers its fields and the previous link's hash.

Version 2 links hash a canonical JSON document ``{"prev", "version", "fields"}`` with
SHA-256 (unambiguous whatever the text holds); datetimes are ISO 8601 in UTC. A chain is
appended under a transaction-level advisory lock held to commit, so links are chained in
commit order and sequence numbers have no gaps. ``walk`` checks a chain in order, in
constant memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

GENESIS = "0" * 64
VERSION = 2
MAX_PROBLEMS = 100


def canonical(value):
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


def link_hash(fields: dict, prev_hash: str, *, version: int = VERSION) -> str:
    document = {
        "prev": prev_hash,
        "version": version,
        "fields": {name: canonical(value) for name, value in fields.items()},
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ChainReport:
    records: int = 0
    head_seq: int = 0
    head: str = GENESIS
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def walk(
    rows: Iterable[dict],
    rehash: Callable[[dict], str],
    *,
    noun: str,
    gap: str,
    check: Callable[[dict], str | None] | None = None,
    after: tuple[int, str] = (0, GENESIS),
) -> ChainReport:
    """Check links in ``chain_seq`` order: no gap, each ``prev_hash`` is the previous hash,
    each ``hash`` is ``rehash(row)``; ``check`` may add one more problem per row. ``after``:
    the link the rows continue (sequence number and hash; default the chain's start)."""
    report = ChainReport(head_seq=after[0], head=after[1])
    prev, expected = after[1], after[0] + 1
    for row in rows:
        report.records += 1
        seq = row["chain_seq"]
        if seq != expected:
            report.problems.append(f"{gap}: expected {noun} {expected}, found {seq}")
        if row["prev_hash"] != prev:
            report.problems.append(f"{noun} {seq}: previous hash does not match")
        if rehash(row) != row["hash"]:
            report.problems.append(f"{noun} {seq}: content does not match its hash")
        extra = check(row) if check else None
        if extra:
            report.problems.append(f"{noun} {seq}: {extra}")
        prev, expected = row["hash"], seq + 1
        report.head_seq, report.head = seq, row["hash"]
        if len(report.problems) > MAX_PROBLEMS:
            break
    return report


def batched(queryset, fields: list[str], batch: int = 5000, *, after: int = 0):
    """Rows of ``queryset`` as dicts in ``chain_seq`` order (those after ``after``), a keyset
    batch at a time."""
    last = after
    while True:
        rows = list(
            queryset.filter(chain_seq__gt=last).order_by("chain_seq").values(*fields)[:batch]
        )
        if not rows:
            return
        yield from rows
        last = rows[-1]["chain_seq"]
