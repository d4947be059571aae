"""Every field of both chains is tamper-evident: an edit of any one column of an audit record
(of every chain version) or of an operator action, made behind the append-only trigger, is
reported by ``retention audit verify``.

The columns each chain version covers are written out here by hand, not read from
``runs.evidence.audit``: leaving a field out of a version's hash (or adding a column to the
records without covering it) fails these tests."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.models import Max
from psycopg import sql

from core.models import OperatorAction
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import audit
from runs.models import AuditRecord, Chunk, Run
from tests.runs.conftest import NOW

pytestmark = pytest.mark.usefixtures("no_guard")

V1 = {
    "chain_seq", "chunk_id", "run_id", "policy_version_id", "policy_slug", "table_name",
    "cutoff", "tenant", "key_from", "key_to", "attempt", "worker_host", "worker_pid",
    "rows_deleted", "started_at", "committed_at", "outcome", "prev_hash",
}  # fmt: skip
V2 = V1 | {
    "chain_version", "run_key", "version_number", "version_hash", "author_id",
    "submitted_by_id", "approved_by_id", "approved_at", "approval_reason",
}  # fmt: skip
COVERED = {
    1: V1,
    2: V2,
    3: V2 | {"partition"},
    4: V2 | {"key_lo", "key_hi"},
    5: V2 | {"key_lo", "key_hi", "tenant_rows"},
    6: V2 | {"key_lo", "key_hi", "tenant_rows", "bound_columns"},
    7: V2 | {"key_lo", "key_hi", "tenant_rows", "bound_columns", "table_rows"},
    8: V2 | {"key_lo", "key_hi", "tenant_rows", "bound_columns", "table_rows", "archive"},
    9: V2
    | {"key_lo", "key_hi", "tenant_rows", "bound_columns", "table_rows", "archive"}
    | {"rows_kept_by_triggers"},
}
# Not evidence: the surrogate key (nothing refers to it; evidence names chain_seq) and the
# hash itself (an edited hash no longer matches the content: covered by every version).
NOT_CONTENT = {"id"}
ACTION_COVERED = {
    "chain_seq", "at", "actor", "action", "target_type", "target_id", "reason", "details",
    "prev_hash",
}  # fmt: skip

# What each version's record carries besides version 2's fields (as the engine writes them).
VERSION_EXTRAS = {
    3: {
        "key_from": 1,
        "key_to": None,
        "partition": {
            "name": "public.rr_events_p2026_10",
            "bounds": "FROM ('2026-10-01') TO ('2026-11-01')",
            "rows": 12,
            "digest": "md5:0123456789abcdef0123456789abcdef",
            "action": "dropped",
            "concurrently": False,
        },
        "outcome": "dropped",
    },
    4: {"key_from": None, "key_to": None, "key_lo": ["a-1"], "key_hi": ["b-9"]},
    5: {
        "key_from": None,
        "key_to": None,
        "key_lo": ["7"],
        "key_hi": ["9"],
        "tenant_rows": {"1": 3},
    },
    6: {
        "key_from": None,
        "key_to": None,
        "key_lo": ["2026-10-01 00:00:00+00", "5"],
        "key_hi": ["2026-10-02 00:00:00+00", "90"],
        "tenant_rows": {"1": 3, "2": 4},
        "bound_columns": ["occurred_at", "id"],
    },
    # a chunk of a table that cascading foreign keys reference: rows removed per table
    7: {"key_from": 7, "key_to": 9, "table_rows": {"public.rr_events": 3, "public.rr_notes": 5}},
    # a chunk archived before its DELETE: where its rows went, with their digest
    8: {
        "key_from": 7,
        "key_to": 9,
        "archive": {
            "to": "file:///srv/archive",
            "objects": [
                {
                    "name": "events/run-1/chunk-1-attempt-1.parquet",
                    "table": "public.rr_events",
                    "rows": 3,
                    "sha256": "0" * 64,
                }
            ],
        },
    },
    # a chunk of a table with a BEFORE DELETE trigger: the rows it matched that the trigger kept
    9: {"key_from": 7, "key_to": 9, "rows_kept_by_triggers": 2},
}


class Undo(Exception):
    """Raised to roll one tampering back."""


def verify() -> str:
    err = StringIO()
    try:
        call_command("retention", "audit", "verify", stdout=StringIO(), stderr=err)
    except CommandError as exc:
        return err.getvalue() + str(exc)
    return ""


def behind_the_trigger(table: str, column: str, value, seq: int) -> None:
    """What the owner (or a superuser) can do: write the row without the triggers firing."""
    jsonb = isinstance(value, (dict, list))
    statement = sql.SQL("UPDATE {} SET {} = {} WHERE chain_seq = %s").format(
        sql.Identifier(table),
        sql.Identifier(column),
        sql.SQL("%s::jsonb") if jsonb else sql.SQL("%s"),
    )
    with connection.cursor() as cur:
        cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(
            statement.as_string(cur.connection), [json.dumps(value) if jsonb else value, seq]
        )


def other_value(column: str, value):
    """A different value of the same type as ``value`` (unique where the column is)."""
    if column in ("chunk_id", "run_id", "policy_version_id"):
        return 10**12
    if column == "chain_seq":
        return value + 10_000
    if isinstance(value, bool) or value is None and column.endswith(("_at", "cutoff")):
        return NOW
    if (
        isinstance(value, int)
        or value is None
        and column.endswith(("_id", "_from", "_to", "_by_triggers"))
    ):
        return (value or 0) + 1
    if column in ("version_number", "partition", "key_lo", "key_hi", "tenant_rows"):
        if value is None:
            return 1 if column == "version_number" else ["x"]
    if column == "bound_columns" and value is None:
        return ["occurred_at"]
    if column == "table_rows" and value is None:
        return {"public.rr_events": 1}
    if column == "archive" and value is None:
        return {"to": "file:///elsewhere", "objects": []}
    if isinstance(value, str):
        return "x" if not value else value[:-1] + ("0" if value[-1] != "0" else "1")
    if hasattr(value, "isoformat"):
        return value + timedelta(seconds=1)
    if isinstance(value, list):
        return [*value, "x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    raise AssertionError(f"no other value for {column} = {value!r}")


def expected_report(column: str, seq: int, covered: set[str], noun: str = "record") -> str:
    if column == "chain_seq":
        return f"expected {noun} {seq}, found"  # the edited row now sorts last
    if column == "prev_hash":
        return f"{noun} {seq}: previous hash does not match"
    if column in covered or column == "chain_version":  # the version chooses the hash
        return f"{noun} {seq}: content does not match its hash"
    return f"{noun} {seq}: carries {column}, which chain version"


def undetected(table: str, model, seq: int, covered: set[str], noun: str) -> list[str]:
    """The columns of row ``seq`` whose edit (each alone, rolled back after) verify misses."""
    columns = [
        f.attname for f in model._meta.concrete_fields if f.attname not in {*NOT_CONTENT, "hash"}
    ]
    missed = []
    for column in columns:
        value = model.objects.filter(chain_seq=seq).values_list(column, flat=True).get()
        try:
            with transaction.atomic():
                behind_the_trigger(table, column, other_value(column, value), seq)
                report = verify()
                raise Undo
        except Undo:
            pass
        if expected_report(column, seq, covered, noun) not in report:
            missed.append(f"{column}: {report or 'nothing reported'}")
    return missed


@pytest.fixture
def drained(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert AuditRecord.objects.filter(chain_version=2).count() >= 3
    return run


def record_of_version(run: Run, version: int) -> int:
    """The chain position of a record of ``version``: version 1 is the chain's first record
    turned back into one (as migrations left old chains); the others are appended by the
    engine's own ``audit.append`` with what such a record carries."""
    if version == 1:
        first = AuditRecord.objects.values(*audit.V1_FIELDS, "prev_hash").get(chain_seq=1)
        v1 = audit.record_hash({**first, "chain_version": 1}, first["prev_hash"])
        columns = [f.attname for f in AuditRecord._meta.concrete_fields]
        rows = list(AuditRecord.objects.order_by("chain_seq").values(*columns))
        with connection.cursor() as cur:
            cur.execute("SET LOCAL session_replication_role = replica")
            blank = ", ".join(f"{name} = NULL" for name in ("version_number", "author_id",
                "submitted_by_id", "approved_by_id", "approved_at"))  # fmt: skip
            cur.execute(
                f"UPDATE runs_auditrecord SET chain_version = 1, run_key = '', version_hash = '',"  # noqa: S608
                f" approval_reason = '', {blank}, hash = %s WHERE chain_seq = 1",
                [v1],
            )
            prev = v1
            for row in rows[1:]:
                row["prev_hash"] = prev
                row["hash"] = prev = audit.record_hash(row, prev)
                cur.execute(
                    "UPDATE runs_auditrecord SET prev_hash = %s, hash = %s WHERE chain_seq = %s",
                    [row["prev_hash"], row["hash"], row["chain_seq"]],
                )
            cur.execute("SET LOCAL session_replication_role = origin")
        return 1
    if version == 2:
        return AuditRecord.objects.filter(chain_version=2).order_by("chain_seq")[1].chain_seq
    template = AuditRecord.objects.filter(chain_version=2).values().first()
    extras = VERSION_EXTRAS[version]
    chunk = Chunk.objects.create(
        run=run, pass_no=9, tenant="", seq=1, key_from=extras["key_from"],
        key_to=extras["key_to"], lo=extras.get("key_lo"), hi=extras.get("key_hi"),
        state=Chunk.State.DONE, attempts=1,
    )  # fmt: skip
    skip = {"id", "chain_seq", "committed_at", "prev_hash", "hash", "chain_version", "chunk_id"}
    values = {k: v for k, v in template.items() if k not in skip}
    record = audit.append(**{**values, **extras, "chunk_id": chunk.pk})
    assert record["chain_version"] == version
    return record["chain_seq"]


def test_the_tamper_tests_know_every_column_and_every_chain_version():
    """A new column of the records, or a new chain version, needs its tamper test here."""
    columns = {f.attname for f in AuditRecord._meta.concrete_fields}
    assert columns == set().union(*COVERED.values()) | NOT_CONTENT | {"hash"}
    assert set(COVERED) == set(audit.FIELDS_BY_VERSION)
    actions = {f.attname for f in OperatorAction._meta.concrete_fields}
    assert actions == ACTION_COVERED | NOT_CONTENT | {"hash"}


@pytest.mark.parametrize("version", sorted(COVERED))
def test_an_edit_of_any_column_of_an_audit_record_is_reported(drained, version):
    seq = record_of_version(drained, version)
    assert AuditRecord.objects.get(chain_seq=seq).chain_version == version
    assert verify() == ""

    assert undetected("runs_auditrecord", AuditRecord, seq, COVERED[version], "record") == []
    assert verify() == ""  # every edit was rolled back


def test_an_edit_of_any_column_of_an_operator_action_is_reported(drained):
    # a row in the middle of the log, with a non-empty document to edit
    last = OperatorAction.objects.aggregate(m=Max("chain_seq"))["m"]
    seq = OperatorAction.objects.filter(chain_seq__lt=last).exclude(details={}).latest("chain_seq")
    seq = seq.chain_seq
    assert verify() == ""

    missed = undetected(
        "retention_operatoraction", OperatorAction, seq, ACTION_COVERED, "operator action"
    )

    assert missed == []
