"""Archive to a table in another registered database (``target:NAME/schema.table``): each
chunk's rows are inserted and committed there, read back, before its DELETE commits; the
destination is checked against its own catalog at apply; a worker killed between the two
commits loses and duplicates no row."""

from __future__ import annotations

import signal
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from core import locks
from retention import actions
from retention.actions import place_hold
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import archives, audit
from runs.models import AuditRecord, Chunk, RestoreRequest, Run
from targets.models import Target
from tests.archive.conftest import TYPED_COLUMNS, create_typed
from tests.factories import approved_policy, events_spec
from tests.fleet import servers
from tests.runs.conftest import NOW, manage
from tests.runs.processes import backends_running, kill_group, pg_connect, spawn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ENV_VAR = "ARCHIVE_TEST_VAULT_DSN"
# every archived column, as text: the same in both databases when the values are
TEXT = (
    "id, ROW(id, tenant_id, occurred_at, status, amount, exact, small, ratio, flag, day,"
    " local_at, doc, js, raw, tags, nums, prices, ref, span)::text"
)
# the killed chunk is replayed whole (not split), so its replay inserts the same rows again
ENV = {"RETENTION_GUARD": "0", "RETENTION_SPLIT_FLOOR_ROWS": "100000"}


@pytest.fixture(scope="module")
def vault_server():
    """A second PostgreSQL server (an embedded one of the fleet's tests)."""
    return servers.embedded("fleet-a")


@pytest.fixture
def vault(vault_server, monkeypatch, transactional_db):
    """A database of its own on the second server, registered as the target ``vault``, with
    an archive table of ``rr_typed``'s columns; its URL in this process's environment (and so
    in the workers it spawns). Yields a function running one query there."""
    database = vault_server.create_database()
    url = vault_server.admin_url(database)
    monkeypatch.setenv(ENV_VAR, url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA archive")
        conn.execute(f"CREATE TABLE archive.rr_typed ({TYPED_COLUMNS})")
    Target.objects.create(name="vault", dsn_env=ENV_VAR)

    def query(text: str, params=()):
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(text, params)
            return cur.fetchall() if cur.description else []

    query.url = url
    yield query
    from targets import connections

    connections.close_all()
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_typed")
    vault_server.drop_database(database)


def _spec(**overrides) -> dict:
    fields = {"archive": {"to": "target:vault/archive.rr_typed", "restore_days": 30}}
    return events_spec(slug="typed", table="rr_typed", **{**fields, **overrides})


def _source(where: str = "TRUE", params=()) -> dict[int, str]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {TEXT} FROM public.rr_typed WHERE {where} ORDER BY id", list(params))
        return dict(cur.fetchall())


def _archived(vault) -> dict[int, str]:
    return dict(vault(f"SELECT {TEXT} FROM archive.rr_typed ORDER BY id"))


def test_a_drained_run_leaves_each_deleted_row_once_in_the_other_database_and_holds_none(
    vault, make_user, no_guard
):
    create_typed()
    policy = approved_policy(make_user, **_spec())
    hold = place_hold(
        actor=make_user("hilde", "compliance"), reason="litigation", policy=policy, tenant="2"
    )
    assert hold.pk
    run, _ = trigger_run(policy, tick=NOW)
    before = _source()
    eligible = _source("occurred_at < %s AND status <> 'disputed' AND tenant_id <> 2", [run.cutoff])
    held = _source("occurred_at < %s AND status <> 'disputed' AND tenant_id = 2", [run.cutoff])
    assert len(eligible) > 50 and held

    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason

    # every deleted row is in the archive table, value for value, and nothing else is
    assert _archived(vault) == eligible
    assert _source() == {k: v for k, v in before.items() if k not in eligible}
    # held rows neither archived nor deleted
    assert all(k in _source() for k in held)
    # the audit records name the archive table, its rows and their digest
    records = list(AuditRecord.objects.filter(run=run, rows_deleted__gt=0))
    assert records
    for record in records:
        assert record.archive["to"] == "target:vault/archive.rr_typed"
        (obj,) = record.archive["objects"]
        assert obj["name"] == f"target:vault/archive.rr_typed#run-{run.pk}/chunk-{record.chunk_id}"
        assert obj["rows"] == record.rows_deleted and len(obj["sha256"]) == 64
    assert archives.archived_rows(run.pk) == len(eligible)
    assert not audit.verify_chain().problems


def test_a_row_with_the_same_key_and_other_values_fails_the_chunk_and_deletes_nothing(
    vault, make_user, no_guard
):
    create_typed()
    policy = approved_policy(make_user, **_spec())
    run, _ = trigger_run(policy, tick=NOW)
    before = _source()
    first = min(_source("occurred_at < %s AND status <> 'disputed'", [run.cutoff]))
    vault(
        "INSERT INTO archive.rr_typed (id, tenant_id, occurred_at) VALUES (%s, 9, now())",
        [first],
    )
    # (until idle: the failed chunk backs off, and the budget would be spent waiting on it)
    worker.drain(run.pk, budget_s=30, until_idle=True)
    run.refresh_from_db()
    with connection.cursor() as cur:
        cur.execute("SELECT last_error FROM runs_chunk WHERE last_error <> ''")
        errors = [r[0] for r in cur.fetchall()]
    assert any("same key and other values in target:vault/archive.rr_typed" in e for e in errors)
    # the conflicting row's chunk deleted nothing; the row is still in the source
    assert first in _source()
    deleted = set(before) - set(_source())
    assert set(_archived(vault)) == deleted | {first}


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        ("DROP TABLE archive.rr_typed", "target vault has no table archive.rr_typed"),
        (
            "ALTER TABLE archive.rr_typed ALTER COLUMN amount TYPE numeric(20,4)",
            "archive.to: target:vault/archive.rr_typed does not fit public.rr_typed: amount is"
            r" numeric\(20,4\), not numeric\(14,4\)",
        ),
        ("ALTER TABLE archive.rr_typed DROP COLUMN span", "span is missing"),
        (
            "ALTER TABLE archive.rr_typed ADD COLUMN batch int NOT NULL",
            "batch is NOT NULL without a default",
        ),
        (
            "ALTER TABLE archive.rr_typed DROP CONSTRAINT rr_typed_pkey",
            r"needs a primary key or unique index on \(id\)",
        ),
    ],
)
def test_a_destination_that_does_not_fit_is_refused_at_apply_with_one_line(
    vault, make_user, prepare, message
):
    create_typed()
    vault(prepare)
    author = make_user("ada", "compliance")
    with pytest.raises(SpecError, match=message) as refused:
        actions.apply_spec(PolicySpec.parse(_spec()), author=author)
    assert "\n" not in str(refused.value)
    assert not actions.PolicyVersion.objects.exists()


def test_an_unregistered_destination_target_is_refused_at_apply(vault, make_user):
    create_typed()
    spec = PolicySpec.parse(_spec(archive={"to": "target:nowhere/archive.rr_typed"}))
    with pytest.raises(SpecError, match=r"^archive.to: no target 'nowhere'"):
        actions.apply_spec(spec, author=make_user("ada", "compliance"))


def test_a_worker_killed_between_the_destination_commit_and_its_own_loses_and_duplicates_no_row(
    vault, make_user
):
    create_typed()
    policy = approved_policy(make_user, **_spec(timeouts={"lock_ms": 8000, "statement_ms": 10000}))
    run, _ = trigger_run(policy, tick=NOW)
    before = _source()
    blocker = pg_connect(autocommit=False)
    # the audit chain's lock, taken after the archive table's commit and before the audit
    # row: the worker deletes, inserts, commits and reads back there, then waits here
    blocker.execute("SELECT pg_advisory_xact_lock(%s, 0)", [locks.AUDIT_CHAIN])
    proc = spawn("retention", "drain", run.run_key, "--until-idle", env=ENV)
    observer = pg_connect()
    try:
        wait_for(
            lambda: (
                observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query ILIKE '%pg_advisory_xact_lock%'"
                ).fetchone()[0]
                and vault("SELECT count(*) FROM archive.rr_typed")[0][0]
            ),
            what="a chunk committed in the archive table and waiting on the chain lock",
        )
        kill_group(proc, signal.SIGKILL)
    finally:
        blocker.rollback()
        blocker.close()
    wait_for(
        lambda: not backends_running(observer, "%pg_advisory_xact_lock%"),
        what="the killed worker's transaction to end",
    )
    observer.close()

    committed_there = _archived(vault)
    assert committed_there  # the destination committed ...
    assert _source() == before  # ... and the source rolled back: the rows are in both
    assert not AuditRecord.objects.exists()

    # the killed attempt's claim, as the next claim finds it once its transaction's lock wait
    # (8 s here) and the margin after it have passed: its chunk is taken again at once
    (killed,) = Chunk.objects.filter(run=run, claimed_at__isnull=False)
    Chunk.objects.filter(pk=killed.pk).update(claimed_at=killed.claimed_at - timedelta(minutes=1))
    result = manage(
        "retention", "drain", run.run_key, "--until-idle", "--budget", "60", env=ENV, timeout=300
    )
    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason

    archived = _archived(vault)
    left = _source()
    assert not set(archived) & set(left)  # no row both archived and kept
    assert {**archived, **left} == before  # no row lost, none changed
    assert archived.items() >= committed_there.items()  # the replay reused what was there
    ids = [r[0] for r in vault("SELECT id FROM archive.rr_typed")]
    assert len(ids) == len(set(ids)) == len(archived)  # none inserted twice
    assert sum(r.rows_deleted for r in AuditRecord.objects.filter(run=run)) == len(archived)


def _cli(*args) -> str:
    out = StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def test_a_tenants_rows_come_back_from_the_archive_table_and_verify_catches_a_change_there(
    vault, make_user, act_as, no_guard
):
    create_typed()
    policy = approved_policy(make_user, **_spec())
    before = _source()
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    others_before = _source("tenant_id <> 2")
    deleted_2 = {k for k, v in before.items() if v.startswith(f"({k},2,")} - set(_source())
    assert len(deleted_2) > 10

    act_as(make_user("alice", "compliance"))
    _cli("restore", run.run_key, "--tenant", "2", "--reason", "deleted by mistake")
    request = RestoreRequest.objects.get()
    act_as(make_user("carol", "compliance"))
    out = _cli("restore", "approve", str(request.pk), "--reason", "confirmed with the tenant")
    assert f"{len(deleted_2)} row(s) put back" in out

    # tenant 2's rows are back exactly as they were; the others' stay deleted
    assert _source("tenant_id = 2") == {k: v for k, v in before.items() if v.startswith(f"({k},2,")}
    assert _source("tenant_id <> 2") == others_before
    restored = AuditRecord.objects.filter(run=run, outcome="restored")
    assert sum(o["rows_restored"] for r in restored for o in r.archive["objects"]) == len(deleted_2)
    assert not audit.verify_chain().problems
    checked, problems = archives.verify_objects()
    assert (
        checked
        == AuditRecord.objects.filter(run=run, outcome="deleted")
        .exclude(archive__objects=[])
        .count()
        and not problems
    )

    # a row changed in the archive table is found; one removed there too
    changed, removed = sorted(_archived(vault))[:2]
    vault("UPDATE archive.rr_typed SET status = 'edited' WHERE id = %s", [changed])
    vault("DELETE FROM archive.rr_typed WHERE id = %s", [removed])
    _checked, problems = archives.verify_objects()
    assert problems and all("target:vault/archive.rr_typed" in p for p in problems)
    assert any("hash to" in p or "holds" in p for p in problems)
