"""The audit hash chain: each record's hash covers its content and the previous hash,
so an edit, a deletion or a gap in ``chain_seq`` is detectable; the chunk ledger shows a
removed tail; a signed anchor kept outside the database (``runs.evidence.anchors``) shows a rewrite
that recomputed every later hash.

Chain version 1 (records written before the version fields existed) hashes ``V1_FIELDS``
joined by U+001F; version 2 (``core.chain``) also covers the run key, the version's number
and content hash, its author, submitter, approver, approval time and reason; version 3 (a
partition taken whole) also covers ``partition``; version 4 also covers the chunk's bounds in
any key type (``key_lo``, ``key_hi``: one text per key column), written for chunks of a key
that is not one integer column (an integer key's chunk is still version 2: its bigint bounds
are the whole payload); version 5, a chunk across tenants, also covers ``tenant_rows``;
version 6, a chunk whose bounds are not on the key (timestamp chunks), also covers
``bound_columns``: the columns ``key_lo``/``key_hi`` are on, in order; version 7, a chunk of a
table that cascading foreign keys reference, also covers ``table_rows``: the rows it removed in
each table its DELETE reaches, the policy's own included; version 8, a chunk of a policy that
archives before deleting (``archive``), also covers ``archive``: the destination and each
object the chunk's rows were written to, with its name, table, rows and SHA-256; version 9, a
chunk of a table with a row-level BEFORE DELETE trigger, also covers ``rows_kept_by_triggers``:
the rows its DELETE matched that the trigger kept.
Each record is verified by the fields of its own version, so older records keep verifying."""

from __future__ import annotations

import functools
import hashlib

from django.db import connection, models
from django.db.models.sql import InsertQuery

from core import chain, locks
from runs.models import AuditRecord, Chunk

GENESIS = chain.GENESIS
CHAIN_VERSION = chain.VERSION  # a chunk of a plain integer key: its bigint bounds say it all

V1_FIELDS = (
    "chain_seq", "chunk_id", "run_id", "policy_version_id", "policy_slug", "table_name", "cutoff",
    "tenant", "key_from", "key_to", "attempt", "worker_host", "worker_pid", "rows_deleted",
    "started_at", "committed_at", "outcome",
)  # fmt: skip
V2_FIELDS = (
    *V1_FIELDS, "chain_version", "run_key", "version_number", "version_hash", "author_id",
    "submitted_by_id", "approved_by_id", "approved_at", "approval_reason",
)  # fmt: skip
# Version 3: a partition taken whole (runs.engine.partitions) — version 2's fields and ``partition``.
PARTITION_CHAIN_VERSION = 3
V3_FIELDS = (*V2_FIELDS, "partition")
# Version 4: a chunk of a key that is not one integer column — version 2's fields and its
# bounds in any key type (one text per key column).
BOUNDS_CHAIN_VERSION = 4
V4_FIELDS = (*V2_FIELDS, "key_lo", "key_hi")
# Version 5: a chunk across tenants — version 4's fields and its rows per tenant.
TENANT_ROWS_CHAIN_VERSION = 5
V5_FIELDS = (*V4_FIELDS, "tenant_rows")
# Version 6: a chunk whose bounds are on other columns than the key (timestamp chunks) —
# version 5's fields and those columns (its tenant_rows NULL when the policy has no tenant).
BOUND_COLUMNS_CHAIN_VERSION = 6
V6_FIELDS = (*V5_FIELDS, "bound_columns")
# Version 7: a chunk of a table that cascading foreign keys reference — version 6's fields and
# the rows it removed in each table ({"schema.table": rows}, cascades included).
TABLE_ROWS_CHAIN_VERSION = 7
V7_FIELDS = (*V6_FIELDS, "table_rows")
# Version 8: a chunk archived before its DELETE — version 7's fields and ``archive``
# ({"to": "file:///DIR", "objects": [{"name", "table", "rows", "sha256"}]}).
ARCHIVE_CHAIN_VERSION = 8
V8_FIELDS = (*V7_FIELDS, "archive")
# Version 9: a chunk of a table with a row-level BEFORE DELETE trigger — version 8's fields and
# ``rows_kept_by_triggers``: the rows its DELETE matched that the trigger kept (RETURN NULL).
TRIGGER_KEPT_CHAIN_VERSION = 9
V9_FIELDS = (*V8_FIELDS, "rows_kept_by_triggers")
HASHED_COLUMNS = [*dict.fromkeys([*V3_FIELDS, *V9_FIELDS]), "prev_hash", "hash"]
FIELDS_BY_VERSION = {
    1: V1_FIELDS,
    CHAIN_VERSION: V2_FIELDS,
    PARTITION_CHAIN_VERSION: V3_FIELDS,
    BOUNDS_CHAIN_VERSION: V4_FIELDS,
    TENANT_ROWS_CHAIN_VERSION: V5_FIELDS,
    BOUND_COLUMNS_CHAIN_VERSION: V6_FIELDS,
    TABLE_ROWS_CHAIN_VERSION: V7_FIELDS,
    ARCHIVE_CHAIN_VERSION: V8_FIELDS,
    TRIGGER_KEPT_CHAIN_VERSION: V9_FIELDS,
}
# Columns a record of an older version leaves empty: what its hash does not cover must stay
# empty, or an edit there (a v2 record given key_lo, which the pages then show) would pass.
CONTENT_COLUMNS = [name for name in HASHED_COLUMNS if name not in ("prev_hash", "hash")]


def _v1_hash(values: dict, prev_hash: str) -> str:
    parts = [prev_hash]
    for name in V1_FIELDS:
        value = values[name]
        parts.append(value.isoformat() if hasattr(value, "isoformat") else str(value))
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def record_hash(values: dict, prev_hash: str) -> str:
    version = values.get("chain_version", 1)
    if version == 1:
        return _v1_hash(values, prev_hash)
    fields = FIELDS_BY_VERSION.get(version, V2_FIELDS)
    link_version = chain.VERSION if fields is V2_FIELDS else version
    return chain.link_hash({name: values[name] for name in fields}, prev_hash, version=link_version)


def unhashed_content(row: dict) -> str | None:
    """What is wrong with a record beyond its hash: an unknown chain version, or a column its
    version does not hash that is not empty (None when nothing is)."""
    version = row["chain_version"]
    fields = FIELDS_BY_VERSION.get(version)
    if fields is None:
        return f"unknown chain version {version}"
    carried = [
        name
        for name in CONTENT_COLUMNS
        if name not in fields and name != "chain_version" and row[name] not in (None, "")
    ]
    if carried:
        return (
            f"carries {', '.join(carried)}, which chain version {version} does not cover: "
            "added after it was written"
        )
    return None


def version_facts(version) -> dict:
    """What a record says about the policy version it deleted under (no user table read:
    the worker role cannot read auth_user, so people are named by id; the operator log,
    chained too, names them)."""
    return {
        "version_number": version.number,
        "version_hash": version.approved_hash or version.content_hash,
        "author_id": version.author_id,
        "submitted_by_id": getattr(version, "submitted_by_id", None),
        "approved_by_id": version.decided_by_id,
        "approved_at": version.decided_at,
        "approval_reason": version.decision_reason,
    }


# The chain head, read after the chain lock in a statement of its own: its snapshot is taken
# after the lock was granted, so it sees every record committed before (and the time read
# here, ``committed_at``, orders the records as the chain does).
HEAD = (
    "SELECT clock_timestamp(), (SELECT chain_seq FROM runs_auditrecord ORDER BY chain_seq DESC LIMIT 1),"
    " (SELECT hash FROM runs_auditrecord ORDER BY chain_seq DESC LIMIT 1)"
)


def lock_and_read_head(cur) -> None:
    """Take the chain lock (held until commit, so records are chained in commit order and
    ``chain_seq`` has no gaps), then read the head: two statements on ``cur``, whose
    ``fetchone()`` is then the head for ``link``. In a pipeline (``core.pipeline``) both go
    in the caller's round trip."""
    cur.execute("SELECT pg_advisory_xact_lock(%s, 0)", [locks.AUDIT_CHAIN])
    cur.execute(HEAD)


def link(values: dict, head: tuple) -> dict:
    """The record ``values`` chained onto ``head`` (from ``lock_and_read_head``): its
    ``chain_seq``, ``committed_at``, ``chain_version``, ``prev_hash`` and ``hash``."""
    committed_at, last_seq, last_hash = head
    seq = (last_seq + 1) if last_seq else 1
    prev = last_hash or GENESIS
    values = {
        "key_lo": None, "key_hi": None, "tenant_rows": None, "bound_columns": None,
        "table_rows": None, "archive": None, "rows_kept_by_triggers": None, **values,
    }  # fmt: skip
    values.update(chain_seq=seq, committed_at=committed_at)
    if values.get("rows_kept_by_triggers") is not None:
        values["chain_version"] = TRIGGER_KEPT_CHAIN_VERSION
    elif values.get("archive") is not None:
        values["chain_version"] = ARCHIVE_CHAIN_VERSION
    elif values.get("table_rows") is not None:
        values["chain_version"] = TABLE_ROWS_CHAIN_VERSION
    elif values.get("partition"):
        values["chain_version"] = PARTITION_CHAIN_VERSION
    elif values.get("bound_columns") is not None:
        values["chain_version"] = BOUND_COLUMNS_CHAIN_VERSION
    elif values.get("tenant_rows") is not None:
        values["chain_version"] = TENANT_ROWS_CHAIN_VERSION
    elif values.get("key_lo") is not None:
        values["chain_version"] = BOUNDS_CHAIN_VERSION
    else:
        values["chain_version"] = CHAIN_VERSION
    values["hash"] = record_hash(values, prev)
    values["prev_hash"] = prev
    return values


def insert(values: dict) -> tuple[str, list]:
    """The INSERT of a linked record as (SQL, parameters), without RETURNING: a caller that
    needs nothing back sends it in a round trip with other statements. The columns and the
    values' adaptation are the ORM's (``AuditRecord.objects.create``), the SQL composed once."""
    fields, text = _insert_statement()
    record = AuditRecord(**values)
    return text, [f.get_db_prep_save(f.pre_save(record, True), connection) for f in fields]


@functools.cache
def _insert_statement() -> tuple[list, str]:
    fields = [f for f in AuditRecord._meta.local_concrete_fields if not f.primary_key]
    query = InsertQuery(AuditRecord)
    query.insert_values(fields, [AuditRecord()])
    ((text, _),) = query.get_compiler(connection=connection).as_sql()
    return fields, text


def append(**values) -> dict:
    """Append one record to the chain inside the caller's transaction.

    Takes the chain lock until commit, so records are chained in commit order
    and ``chain_seq`` has no gaps.
    """
    with connection.cursor() as cur:
        lock_and_read_head(cur)
        head = cur.fetchone()
    values = link(values, head)
    AuditRecord.objects.create(**values)
    return values


ChainReport = chain.ChainReport


def _record_checks():
    """Checks of each record besides its link: no chain-version downgrade, nothing outside
    what its version hashes."""
    seen_v2 = False

    def check(row: dict) -> str | None:
        nonlocal seen_v2
        if row["chain_version"] >= 2:
            seen_v2 = True
        elif seen_v2:
            return f"chain version {row['chain_version']} after version 2"
        return unhashed_content(row)

    return check


def walk_records(batch: int = 5000, *, after: tuple[int, str] | None = None) -> ChainReport:
    """Walk the records in order, in constant memory (``after``: only those after this link,
    which they must continue)."""
    after = after or (0, GENESIS)
    rows = chain.batched(AuditRecord.objects.all(), HASHED_COLUMNS, batch, after=after[0])
    return chain.walk(
        rows,
        lambda row: record_hash(row, row["prev_hash"]),
        noun="record",
        gap="gap",
        check=_record_checks(),
        after=after,
    )


def verify_chain(batch: int = 5000) -> ChainReport:
    """Walk the whole chain in order, in constant memory; then the tail: every finished
    chunk must have its record (removing the newest records leaves a chain that links up) —
    except a count run's, which deletes nothing and has none."""
    report = walk_records(batch)
    orphans = (
        Chunk.objects.filter(state=Chunk.State.DONE, audit__isnull=True)
        .exclude(run__policy_version__spec__contains={"rollout": "count"})  # its version says so
        .count()
    )
    if orphans:
        report.problems.append(
            f"{orphans} finished chunk(s) have no audit record: records were removed"
        )
    return report


def rows_by_table(run_id: int) -> dict[str, int]:
    """Rows a run's chunks removed in each table their DELETEs reached through cascading
    foreign keys, its own table included, from the records' ``table_rows`` (chain version 7);
    empty when no record has them (no cascading foreign key references the table)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT e.key, sum(e.value::bigint) FROM runs_auditrecord a,"
            " jsonb_each_text(a.table_rows) AS e WHERE a.run_id = %s AND a.table_rows IS NOT NULL"
            " GROUP BY e.key ORDER BY e.key",
            [run_id],
        )
        return {name: int(rows) for name, rows in cur.fetchall()}


def rows_kept_by_triggers(run_id: int, pass_no: int | None = None) -> int | None:
    """Rows a run's chunks (of pass ``pass_no``, else every pass) matched and a BEFORE DELETE
    trigger kept (RETURN NULL), from the records' ``rows_kept_by_triggers`` (chain version 9);
    None when no record counted them (the table has no such trigger)."""
    records = AuditRecord.objects.filter(run_id=run_id, rows_kept_by_triggers__isnull=False)
    if pass_no is not None:
        records = records.filter(chunk__pass_no=pass_no)
    return records.aggregate(n=models.Sum("rows_kept_by_triggers"))["n"]


def measured_rate(slug: str) -> float | None:
    """Rows per second per worker seen in this policy's recent committed chunks, if any
    (the dry-run preview's rate: ``retention.signals.preview_rate_sources``)."""
    records = list(
        AuditRecord.objects.filter(policy_slug=slug, rows_deleted__gt=0)
        .order_by("-chain_seq")
        .values_list("rows_deleted", "started_at", "committed_at")[:200]
    )
    rows = sum(r[0] for r in records)
    seconds = sum(max((r[2] - r[1]).total_seconds(), 0.0) for r in records)
    if rows < 1000 or seconds <= 0:
        return None
    return rows / seconds
