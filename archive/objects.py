"""Archive objects: Parquet files, one per table per chunk attempt, under the policy's
directory. Written through a temporary name, synced and renamed, then read back from disk:
their SHA-256 (of the bytes on disk) compared with the one computed while writing, and the row
count of their footer with the rows written (``audit verify --archives`` decodes every row). The same rows written again give the same bytes, so a replay after a crash writes a
file byte-identical to the one the crash left.

    <dir>/<policy slug>/run-<run id>/chunk-<chunk id>-attempt-<n>.parquet
    <dir>/<policy slug>/target-<name>/run-<run id>/chunk-<chunk id>-attempt-<n>.parquet

The second form for a run on a target other than the control database: each ledger numbers
its runs and chunks from 1, so the target's name keeps one database's objects from ever
replacing another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

COMPRESSION = "zstd"
# no dictionary pages: on rows of mostly distinct values they cost half the write's time and
# make a larger file than zstd alone (measured, docs/performance.md)
READ_BLOCK = 1 << 20
_NAME = re.compile(r"^chunk-(\d+)-attempt-(\d+)\.parquet$")


class ArchiveError(OSError):
    """An archive object could not be written or does not read back as written."""


@dataclass(frozen=True)
class ArchivedObject:
    name: str  # relative to the policy's archive directory
    table: str  # schema.table
    rows: int
    sha256: str

    def to_json(self) -> dict:
        return {"name": self.name, "table": self.table, "rows": self.rows, "sha256": self.sha256}


def policy_prefix(slug: str, target: str = "default") -> str:
    """The directory, under the archive's, of a policy's objects from one database's runs."""
    return slug if target == "default" else f"{slug}/target-{target}"


def object_name(
    slug: str, run_id: int, chunk_id: int, attempt: int, target: str = "default"
) -> str:
    """Where a chunk attempt's rows go, from its database, run, chunk and attempt only."""
    return f"{policy_prefix(slug, target)}/run-{run_id}/chunk-{chunk_id}-attempt-{attempt}.parquet"


def parse_name(name: str) -> tuple[int, int] | None:
    """(chunk id, attempt) of an object's file name (or of its temporary file), or None for
    any other file."""
    match = _NAME.match(Path(name).name.removesuffix(".tmp"))
    return (int(match.group(1)), int(match.group(2))) if match else None


class _HashingFile:
    """A binary file that hashes what is written to it (pyarrow writes through ``write``)."""

    def __init__(self, raw) -> None:
        self.raw, self.digest, self.closed = raw, hashlib.sha256(), False

    def write(self, data) -> int:
        view = memoryview(data)
        self.digest.update(view)
        return self.raw.write(view)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (flat memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def decoded_rows(path: str | Path) -> int:
    """Rows of a Parquet file, counted by decoding every record batch (flat memory)."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow.parquet as pq

    return sum(batch.num_rows for batch in pq.ParquetFile(path).iter_batches(batch_size=65536))


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(
    root: str, name: str, table: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
) -> ArchivedObject:
    """Write ``batches`` (streamed: one in memory at a time) as ``root/name``, sync it, and
    read it back: the bytes on disk must hash to what was written and their footer must count
    as many rows.
    An earlier file of the same name (a crashed attempt's) is replaced whole by the rename."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow.parquet as pq

    path = Path(root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    rows = 0
    try:
        with open(tmp, "wb") as raw:
            sink = _HashingFile(raw)
            with pq.ParquetWriter(
                sink, schema, compression=COMPRESSION, use_dictionary=False
            ) as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    rows += batch.num_rows
            raw.flush()
            os.fsync(raw.fileno())
    except BaseException:
        with contextlib.suppress(OSError):  # a partial file helps no one
            tmp.unlink(missing_ok=True)
        raise
    written = sink.digest.hexdigest()
    os.replace(tmp, path)
    _sync_dir(path.parent)
    on_disk = file_sha256(path)
    if on_disk != written:
        raise ArchiveError(f"archive object {name} reads back with another digest than written")
    footer = pq.read_metadata(path).num_rows
    if footer != rows:
        raise ArchiveError(f"archive object {name} reads back {footer} rows, {rows} were written")
    return ArchivedObject(name, table, rows, on_disk)


def objects_under(root: str, slug: str) -> Iterator[tuple[int, Path]]:
    """(run id, path) of every object file (and leftover temporary file) of the policy."""
    base = Path(root) / slug
    if not base.is_dir():
        return
    for run_dir in base.iterdir():
        if not run_dir.is_dir() or not run_dir.name.startswith("run-"):
            continue
        try:
            run_id = int(run_dir.name[4:])
        except ValueError:
            continue
        for path in run_dir.iterdir():
            if path.name.endswith(".parquet") or path.name.endswith(".parquet.tmp"):
                yield run_id, path


def remove_orphans(root: str, slug: str, keep) -> list[str]:
    """Remove the policy's object files that ``keep(run_id, chunk_id, name)`` does not keep
    (``name`` relative to ``root``, without a temporary file's ``.tmp``); their names.
    ``slug``: a ``policy_prefix`` — one database's objects of the policy."""
    removed = []
    for run_id, path in objects_under(root, slug):
        parsed = parse_name(path.name)
        if parsed is None:
            continue
        name = f"{slug}/{path.parent.name}/{path.name.removesuffix('.tmp')}"
        if keep(run_id, parsed[0], name):
            continue
        path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(root)))
    return sorted(removed)
