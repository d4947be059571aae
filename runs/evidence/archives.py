"""What a run's archive holds, read from the audit records that name its objects (chain
version 8), and the check that the objects on disk are still what the chain says.

One home for these figures: ``retention status --json`` (``archived_rows``), the run page, the
manifest and the CSV all read them here (the CSV in SQL, the same JSON paths).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from django.db import connection

from archive import objects
from retention.spec import archive_path
from runs.models import AuditRecord

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


def all_objects(batch: int = 1000) -> Iterator[tuple[int, dict, str]]:
    """(chain_seq, object, destination) of every archive object the chain names, in order."""
    records = (
        AuditRecord.objects.filter(archive__isnull=False, outcome="deleted")
        .order_by("chain_seq")
        .values_list("chain_seq", "archive")
    )
    for seq, archive in records.iterator(chunk_size=batch):
        for o in archive.get("objects", []):
            yield seq, o, archive.get("to") or ""


def verify_objects() -> tuple[int, list[str]]:
    """Re-read every archive object the chain names: it must exist, its bytes must hash to
    the SHA-256 its record holds, and decoding it must give the record's row count. Returns
    (objects checked, problems: one line each)."""
    checked, problems = 0, []
    for seq, o, to in all_objects():
        checked += 1
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
