"""A worker killed between its archive object's write and its commit: no row lost, none
archived twice after the replay, and the reconciler removes the orphan."""

from __future__ import annotations

import signal

import pyarrow.parquet as pq
import pytest
from django.db import connection

from core import locks
from runs.actions import trigger_run
from runs.engine import reconciler
from runs.models import AuditRecord, Run
from tests.archive.conftest import create_typed, typed_spec
from tests.factories import approved_policy
from tests.runs.conftest import NOW, manage
from tests.runs.processes import (
    backends_running,
    kill_group,
    pg_connect,
    spawn,
    wait_for,
)


def backends_waiting_on_lock(conn, pattern: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query ILIKE %s",
        [pattern],
    ).fetchone()[0]


# the killed chunk is replayed whole (not split), so its replay writes the same rows again
ENV = {"RETENTION_GUARD": "0", "RETENTION_SPLIT_FLOOR_ROWS": "100000"}


@pytest.fixture
def typed_table(transactional_db):
    create_typed()
    yield "rr_typed"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_typed")


def _ids() -> list[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_typed ORDER BY id")
        return [r[0] for r in cur.fetchall()]


def test_a_worker_killed_after_writing_its_archive_loses_and_duplicates_no_row(
    typed_table, make_user, tmp_path
):
    archive_dir = tmp_path / "archive"
    archive_dir.mkdir()
    policy = approved_policy(
        make_user, **typed_spec(archive_dir, timeouts={"lock_ms": 8000, "statement_ms": 10000})
    )
    run, _ = trigger_run(policy, tick=NOW)
    before = _ids()
    blocker = pg_connect(autocommit=False)
    # the audit chain's lock, taken after the archive object is written and before the audit
    # row: the worker deletes, writes and verifies the object, then waits here
    blocker.execute("SELECT pg_advisory_xact_lock(%s, 0)", [locks.AUDIT_CHAIN])
    worker = spawn("retention", "drain", run.run_key, "--until-idle", env=ENV)
    observer = pg_connect()
    try:
        wait_for(
            lambda: (
                backends_waiting_on_lock(observer, "%pg_advisory_xact_lock%")
                and list(archive_dir.rglob("*.parquet"))
            ),
            what="an archive object written and its chunk waiting on the chain lock",
        )
        kill_group(worker, signal.SIGKILL)
    finally:
        blocker.rollback()
        blocker.close()
    wait_for(
        lambda: not backends_running(observer, "%pg_advisory_xact_lock%"),
        what="the orphan to end",
    )
    observer.close()

    assert _ids() == before
    assert not AuditRecord.objects.exists()
    orphans = {p.relative_to(archive_dir): p.read_bytes() for p in archive_dir.rglob("*.parquet")}
    assert orphans and all("-attempt-1." in str(p) for p in orphans)

    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "60", env=ENV, timeout=300
    )
    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason

    # the replay of the killed chunk wrote the same bytes under its own attempt's name
    for orphan, data in orphans.items():
        replay = archive_dir / str(orphan).replace("-attempt-1.", "-attempt-2.")
        assert replay.read_bytes() == data

    report = reconciler.reconcile()
    assert sorted(report["archive_orphans"]) == sorted(str(p) for p in orphans)
    files = sorted(archive_dir.rglob("*.parquet"))
    named = sorted(
        archive_dir / o["name"]
        for r in AuditRecord.objects.filter(run=run)
        for o in r.archive["objects"]
    )
    assert files == named
    archived = [i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]
    assert len(archived) == len(set(archived))  # no row archived twice
    remaining = _ids()
    assert sorted(archived + remaining) == before  # no row lost
    assert sum(r.rows_deleted for r in AuditRecord.objects.filter(run=run)) == len(archived)
