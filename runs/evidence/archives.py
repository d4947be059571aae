"""What a run's archive holds, read from the audit records that name its objects (chain
version 8), and the check that the objects on disk are still what the chain says.

One home for these figures: ``retention status --json`` (``archived_rows``), the run page, the
manifest and the CSV all read them here (the CSV in SQL, the same JSON paths).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from django.db import connection

from archive import objects, tables
from retention import predicate as P
from retention.spec import ARCHIVE_TARGET_PREFIX, archive_path, archive_table
from runs.evidence import audit
from runs.models import AuditRecord, Chunk, Run

# The objects of one record's ``archive``, as SQL over runs_auditrecord ``a`` (the CSV's).
OBJECT_NAMES_SQL = (
    "(SELECT string_agg(o->>'name', ' ') FROM jsonb_array_elements(a.archive->'objects') o)"
)


def archived_rows(run_id: int) -> int:
    """Rows of the run written to archive objects (a restore's records not included)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum((o->>'rows')::bigint), 0) FROM runs_auditrecord a,"
            " jsonb_array_elements(a.archive->'objects') o"
            " WHERE a.run_id = %s AND a.archive IS NOT NULL AND a.outcome = 'deleted'",
            [run_id],
        )
        return int(cur.fetchone()[0])


EXPIRED = "expired"  # the outcome of a record naming objects removed by [archive] keep_years
OBJECT_FIELDS = ("name", "table", "rows", "sha256")


def object_facts(item: dict) -> dict:
    """What a record says of one archive object: its name, table, rows and SHA-256."""
    return {k: item[k] for k in OBJECT_FIELDS}


def append_object_record(
    run: Run, version, spec, *, table: str, tenant: str, outcome: str, started_at: datetime,
    archive: dict,
) -> dict:  # fmt: skip
    """One audit record, in the caller's transaction, about a run's archive objects rather than
    a chunk (a restore from them, their removal under keep_years): no chunk, no key range, no
    row deleted; ``archive`` names the destination and the objects."""
    return audit.append(
        chunk_id=None,
        run_id=run.pk,
        policy_version_id=version.pk,
        policy_slug=spec.slug,
        table_name=table,
        cutoff=run.bound,
        tenant=tenant,
        key_from=None,
        key_to=None,
        attempt=1,
        worker_host=socket.gethostname(),
        worker_pid=os.getpid(),
        rows_deleted=0,
        started_at=started_at,
        outcome=outcome,
        run_key=run.run_key,
        archive=archive,
        **audit.version_facts(version),
    )


def expired_names(run_id: int | None = None) -> set[str]:
    """Names of the archive objects the chain records as expired (``runs.archive_expiry``), of
    one run or of all."""
    records = AuditRecord.objects.filter(outcome=EXPIRED, archive__isnull=False)
    if run_id is not None:
        records = records.filter(run_id=run_id)
    return {o["name"] for a in records.values_list("archive", flat=True) for o in a["objects"]}


def run_objects(run_id: int, *, limit: int | None = None) -> list[dict]:
    """The run's archive objects in chain order: name, table, rows, sha256, the record's
    chain_seq and chunk, and the destination they were written to."""
    found = []
    records = (
        AuditRecord.objects.filter(run_id=run_id, archive__isnull=False, outcome="deleted")
        .order_by("chain_seq")
        .values_list("chain_seq", "chunk_id", "archive")
    )
    for seq, chunk_id, archive in records.iterator(chunk_size=1000):
        for o in archive.get("objects", []):
            found.append({**o, "to": archive.get("to"), "audit_seq": seq, "chunk": chunk_id})
            if limit is not None and len(found) >= limit:
                return found
    return found


def object_path(to: str, name: str) -> Path:
    return Path(archive_path(to)) / name


def in_table(item: dict) -> bool:
    """Whether an archive object is a chunk's rows in an archive table of another database
    (``[archive] to = "target:NAME/schema.table"``), not a file."""
    return (item.get("to") or "").startswith(ARCHIVE_TARGET_PREFIX)


def table_object_scope(run: Run, spec, item: dict) -> P.Fragment:
    """Where an archive table holds a chunk's rows: the chunk's tenant and key interval, older
    than its run's cutoff (``archive.tables.chunk_scope``)."""
    chunk = Chunk.objects.get(pk=item["chunk"])
    lo, hi = chunk.bounds()
    return tables.chunk_scope(
        spec,
        tenant=chunk.tenant if run.per_tenant(spec) else None,
        lo=lo,
        hi=hi,
        columns=run.bound_columns(spec),
        cutoff=run.bound,
    )


def table_object_problem(run: Run, spec, item: dict) -> str | None:
    """Why an archive table no longer holds a chunk's rows as its audit record says, or None.
    The table holds every row archived from the chunk's scope — by this run and by any other
    that archived from the same interval: fewer rows than the record's is a loss; exactly as
    many must hash to the record's SHA-256; more are checked by count only."""
    where = f"archive object {item['name']}"
    dest = archive_table(item["to"])
    try:
        rows, digest = tables.read_back(spec, dest, table_object_scope(run, spec, item))
    except Exception as exc:  # an unreachable destination is a finding, not a crash
        return f"{where}: cannot read {dest.url} ({str(exc).strip().splitlines()[0]})"
    if rows < item["rows"]:
        return f"{where}: {dest.url} holds {rows} rows of the chunk's scope, the chain says {item['rows']}"
    if rows == item["rows"] and digest != item["sha256"]:
        return f"{where}: its rows in {dest.url} hash to {digest}, the chain says {item['sha256']}"
    return None


def all_objects(batch: int = 1000) -> Iterator[tuple[int, dict, str]]:
    """(chain_seq, object, destination) of every archive object the chain names, in order
    (each object with its record's ``run`` and ``chunk``)."""
    records = (
        AuditRecord.objects.filter(archive__isnull=False, outcome="deleted")
        .order_by("chain_seq")
        .values_list("chain_seq", "archive", "run_id", "chunk_id")
    )
    for seq, archive, run_id, chunk_id in records.iterator(chunk_size=batch):
        for o in archive.get("objects", []):
            yield seq, {**o, "run": run_id, "chunk": chunk_id}, archive.get("to") or ""


def verify_objects() -> tuple[int, list[str]]:
    """Re-read every archive object the chain names: it must exist, its bytes must hash to
    the SHA-256 its record holds, and decoding it must give the record's row count; a chunk's
    rows in an archive table must be there (``table_object_problem``). An object a later
    record names as expired (``[archive] keep_years``) is gone by design and not checked.
    Returns (objects checked, problems: one line each)."""
    checked, problems = 0, []
    runs: dict[int, Run] = {}
    gone = expired_names()
    for seq, o, to in all_objects():
        if o["name"] in gone:
            continue
        checked += 1
        if in_table({"to": to}):
            if o["run"] not in runs:
                runs[o["run"]] = Run.objects.select_related("policy_version").get(pk=o["run"])
            run = runs[o["run"]]
            problem = table_object_problem(run, run.policy_version.parsed, {**o, "to": to})
            if problem:
                problems.append(f"{problem} (record {seq})")
            continue
        path = object_path(to, o["name"])
        where = f"archive object {o['name']} (record {seq})"
        if not path.is_file():
            problems.append(f"{where}: missing from {to}")
            continue
        digest = objects.file_sha256(path)
        if digest != o["sha256"]:
            problems.append(f"{where}: SHA-256 {digest} differs from the chain's {o['sha256']}")
            continue
        try:
            rows = objects.decoded_rows(path)
        except Exception as exc:  # an unreadable file is a finding, not a crash
            problems.append(f"{where}: does not read as Parquet ({exc})")
            continue
        if rows != o["rows"]:
            problems.append(f"{where}: holds {rows} rows, the chain says {o['rows']}")
    return checked, problems
