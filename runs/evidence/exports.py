"""Audit evidence: the filtered audit trail as streaming CSV, and a run's evidence manifest.

Both stream from a server-side cursor (``.iterator(chunk_size=...)`` over ``values_list``),
so memory stays flat whether a run has ten chunks or ten million audit rows.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.postgres.expressions import ArraySubquery
from django.db import DatabaseError, connection, transaction
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    Exists,
    F,
    Func,
    JSONField,
    Max,
    Min,
    OuterRef,
    Q,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, NullIf
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone
from psycopg.errors import QueryCanceled

from core.filters import QueryFilters, as_id
from core.models import OperatorAction
from retention.floors import of_table as floors_of
from retention.floors import shown as floor_shown
from retention.models import LegalHold, Policy
from retention.periods import periods as periods_of
from runs.counts import count_totals
from runs.evidence import anchors as evidence
from runs.evidence import archives, audit
from runs.models import AuditRecord, Chunk, Run, show_bound
from runs.progress import progress_for
from targets import connections as C
from targets.models import DEFAULT

User = get_user_model()
BATCH = 5000
PARTITION_KEYS = ("name", "bounds", "rows", "digest")

CSV_COLUMNS = [
    ("chain_seq", "chain_seq"),
    ("committed_at", "committed_at_text"),
    ("started_at", "started_at_text"),
    ("policy", "policy_slug"),
    ("policy_version", "policy_version__number"),
    # the approved version's content hash and its approver, as the record states them
    # (a version 1 record, written before it carried them: the version's own)
    ("version_hash", "version_hash_text"),
    ("approved_by", "approved_by_name"),
    # the version's own name (what it was approved as, not the policy's name today), and its
    # approval's reason and time
    ("version_name", "version_name_text"),
    ("approval_reason", "policy_version__decision_reason"),
    ("approved_at", "approved_at_text"),
    ("run_id", "run_id"),
    ("run_key", "run__run_key"),
    # the run's rollout stage: full, slice (cutoff below is its slice bound) or count
    ("rollout", "run__rollout"),
    ("chunk_id", "chunk_id"),
    ("table", "table_name"),
    ("tenant", "tenant"),
    ("key_from", "key_from"),
    ("key_to", "key_to"),
    # any key type: a JSON array of the key columns' texts (empty: an integer key's record)
    ("key_lo", "key_lo_text"),
    ("key_hi", "key_hi_text"),
    # the columns key_lo/key_hi are on when they are not the key's (timestamp chunks, chain
    # version 6): "occurred_at, id"; empty: the policy's key
    ("bounds_on", "bounds_on_text"),
    ("cutoff", "cutoff_text"),
    ("attempt", "attempt"),
    ("rows_deleted", "rows_deleted"),
    # a count run's chunk (no audit record: it deleted nothing): what its DELETE would have
    # removed; empty on an audit record's line
    ("rows_counted", "rows_counted_text"),
    # rows removed in each table the chunk's DELETE reached through cascading foreign keys, its
    # own included (chain version 7): {"schema.table": rows}; empty: no cascading key
    ("table_rows", "table_rows_text"),
    # a chunk archived before its DELETE (chain version 8): its archive objects' names under
    # the policy's [archive] directory, their rows and SHA-256s (space-separated, in order)
    ("archive_objects", "archive_objects_text"),
    ("archive_rows", "archive_rows_text"),
    ("archive_sha256", "archive_sha256_text"),
    # what happened, read from the record: deleted, held, nothing eligible, dropped, detached
    ("outcome", "outcome_text"),
    ("recorded_outcome", "outcome"),  # the record's own outcome field, as the chain hashes it
    # a partition taken whole (outcome dropped / detached): what its record names
    ("partition", "partition_name"),
    ("partition_bounds", "partition_bounds"),
    ("partition_rows", "partition_rows"),
    ("partition_digest", "partition_digest"),
    # the legal holds in force over the chunk when it committed (ids, space-separated), and its
    # rows per tenant as JSON (a chunk across tenants: as its record counts them)
    ("holds", "holds_text"),
    ("tenant_rows", "tenant_rows_text"),
    ("worker_host", "worker_host"),
    ("worker_pid", "worker_pid"),
    ("prev_hash", "prev_hash"),
    ("hash", "hash"),
]
# Columns that hold free text (names, tenants, hosts); only these can carry a formula.
# (``Neutralized`` repeats its expression: one with bound parameters cannot be among them —
# the outcomes are the product's own words.)
TEXT_COLUMNS = {
    "policy", "run_key", "table", "tenant", "worker_host", "partition",
    "partition_bounds", "approved_by", "version_name", "approval_reason",
}  # fmt: skip


class ArchiveObjects(Func):
    """One key of each of a record's archive objects, space-separated (NULL: no archive).
    Names are the product's own (``slug/run-N/chunk-N-attempt-N.parquet``), digests hex."""

    template = "(SELECT string_agg(o->>%(key)s, ' ') FROM jsonb_array_elements(%(expressions)s->'objects') o)"
    output_field = TextField()

    def __init__(self, expression, *, key: str):
        super().__init__(expression, key=f"'{key}'" if key in ("name", "sha256") else "''")


class ArchiveRows(Func):
    """The rows of a record's archive objects (NULL: no archive)."""

    template = (
        "(SELECT sum((o->>'rows')::bigint) FROM jsonb_array_elements(%(expressions)s->'objects') o)"
    )
    output_field = BigIntegerField()


class IsoText(Func):
    """A timestamp as ISO-8601 text, formatted by PostgreSQL (``2026-11-30T03:00:00+00:00``):
    cheaper than building and re-formatting a Python datetime per cell."""

    template = "(to_json(%(expressions)s) #>> '{}')"
    output_field = TextField()


class SpecName(Func):
    """A version's ``name`` from its spec, the key written in the SQL (no bound parameter:
    ``Neutralized`` repeats the expression)."""

    template = "(%(expressions)s ->> 'name')"
    output_field = TextField()


class ColumnList(Func):
    """A JSON array of column names as one text, ``occurred_at, id`` (NULL for NULL). Column
    names are SQL identifiers (letters, digits, ``_``): never a formula."""

    template = (
        "(SELECT string_agg(c, ', ' ORDER BY n)"
        " FROM jsonb_array_elements_text(%(expressions)s) WITH ORDINALITY AS e(c, n))"
    )
    output_field = TextField()


class PartitionFact(Func):
    """One key of the record's ``partition`` document as text, the key written into the SQL
    (one of ``PARTITION_KEYS``, never a value from a request): ``Neutralized`` repeats its
    expression, which a bound key parameter cannot follow."""

    template = "(%(expressions)s ->> '%(key)s')"
    output_field = TextField()

    def __init__(self, expression, *, key: str):
        assert key in PARTITION_KEYS
        super().__init__(expression, key=key)


class Neutralized(Func):
    """A cell a spreadsheet would run as a formula (starting with ``= + - @``, a tab or a carriage
    return) gets a leading single quote — in SQL, so the export loop does no per-cell work."""

    template = (
        "CASE WHEN left(%(expressions)s, 1) IN ('=', '+', '-', '@', E'\\t', E'\\r') "
        "THEN chr(39) || %(expressions)s ELSE %(expressions)s END"
    )
    output_field = TextField()


FILTER_NAMES = ("policy", "run", "tenant", "from", "to")


@dataclass
class AuditFilters:
    policy: str = ""
    run: str = ""
    tenant: str = ""
    date_from: date | None = None
    date_to: date | None = None
    errors: tuple[str, ...] = ()

    @classmethod
    def from_query(cls, query) -> AuditFilters:
        read = QueryFilters(query)
        filters = cls(
            policy=read.text("policy"),
            run=read.text("run"),
            tenant=read.text("tenant"),
            date_from=read.day("from"),
            date_to=read.day("to"),
        )
        if filters.run and filters.run_obj() is None:
            read.errors.append(f"run: no run with id or key {filters.run[:80]!r}")
        if filters.policy and not filters.policy_known():
            read.errors.append(f"policy: no policy named {filters.policy[:80]!r}")
        if filters.date_from and filters.date_to and filters.date_from > filters.date_to:
            read.errors.append(f"from: {filters.date_from} is after to: {filters.date_to}")
        for name in query:  # a misspelt or repeated filter must not widen the selection
            if name not in FILTER_NAMES:
                read.errors.append(
                    f"unknown filter {name[:40]!r} (filters: {', '.join(FILTER_NAMES)})"
                )
            elif len(query.getlist(name)) > 1:
                read.errors.append(f"{name}: given more than once")
        filters.errors = tuple(read.errors)
        return filters

    def policy_known(self) -> bool:
        """A policy of that slug exists, or records carry it (a slug the records keep)."""
        return (
            Policy.objects.filter(slug=self.policy).exists()
            or AuditRecord.objects.filter(policy_slug=self.policy).exists()
        )

    def run_obj(self) -> Run | None:
        if not self.run:
            return None
        run_id = as_id(self.run)
        if run_id is not None:
            return Run.objects.filter(pk=run_id).first()
        return Run.objects.filter(run_key=self.run).first()

    def label(self) -> str:
        parts = [self.policy, self.run, self.tenant and f"tenant-{self.tenant}"]
        if self.date_from:
            parts.append(f"from-{self.date_from}")
        if self.date_to:
            parts.append(f"to-{self.date_to}")
        text = "_".join(p for p in parts if p) or "all"
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:120]


def file_stem(run_key: str) -> str:
    """A run's evidence files are ``<stem>.csv`` and ``<stem>.manifest.json``: its run key,
    with anything but letters, digits, ``_ . -`` as ``-`` (``events/2026-11-30T12:00`` →
    ``events-2026-11-30T12-00``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", run_key)[:180]


def _start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


@contextmanager
def whole_result_cursor():
    """A transaction for a server-side cursor that will read its whole result.

    Inside a transaction the cursor needs no ``WITH HOLD`` (which would make PostgreSQL
    materialize the whole result at the first commit), and ``cursor_tuple_fraction = 1``
    makes the planner pick the plan for all rows rather than for the first 10 %
    (e.g. the run's own index instead of a walk of the whole chain filtered by run).
    """
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL cursor_tuple_fraction = 1.0")
        yield


def audit_queryset(filters: AuditFilters):
    """Audit records matching ``filters``, in chain order. Dates are whole days, inclusive."""
    qs = AuditRecord.objects.all()
    if filters.errors:  # a filter that could not be read selects nothing, never everything
        return qs.none()
    if filters.policy:
        qs = qs.filter(policy_slug=filters.policy)
    if filters.run:
        run_id = as_id(filters.run)
        if run_id is not None:
            qs = qs.filter(run_id=run_id)
        else:
            qs = qs.filter(run__run_key=filters.run)
    if filters.tenant:
        qs = qs.filter(tenant=filters.tenant)
    if filters.date_from:
        qs = qs.filter(committed_at__gte=_start_of(filters.date_from))
    if filters.date_to:
        qs = qs.filter(committed_at__lt=_start_of(filters.date_to + timedelta(days=1)))
    return qs.order_by("chain_seq")


HELD = "held"
NOTHING_ELIGIBLE = "nothing eligible"


def hold_applied(via: str = ""):
    """An ``Exists`` over ``covering_holds``."""
    return Exists(covering_holds(via))


def holds_in_force(via: str = ""):
    """The ids of ``covering_holds``, space-separated ('' when none)."""
    ids = ArraySubquery(covering_holds(via).order_by("id").values("id"))
    return Func(ids, Value(" "), function="array_to_string", output_field=TextField())


def covering_holds(via: str = ""):
    """The legal holds that covered the record's chunk when it committed: on
    its policy or all policies, its tenant or all tenants, a key interval that overlaps the
    chunk's (a chunk of another key type: any interval, as the DELETE decides it), placed
    before the commit and not released before it. ``via``: the path from the outer query's
    model to the audit record (``"audit__"`` from a chunk)."""
    # the record's bounds; NULL (to the end, or not an integer key) reads as unbounded
    lo = Coalesce(OuterRef(f"{via}key_from"), Value(-(2**63)), output_field=BigIntegerField())
    hi = Coalesce(OuterRef(f"{via}key_to"), Value(2**63 - 1), output_field=BigIntegerField())
    overlaps = (Q(key_from__isnull=True) | Q(key_from__lt=hi)) & (
        Q(key_to__isnull=True) | Q(key_to__gt=lo)
    )
    # a chunk across tenants (tenant '') is covered by a hold on any tenant of its policy:
    # which tenants its rows belonged to is not recorded when it deleted none
    holds = LegalHold.objects.annotate(
        record_tenant=Coalesce(OuterRef(f"{via}tenant"), Value(""), output_field=TextField())
    ).filter(
        Q(policy__isnull=True) | Q(policy_id=OuterRef(f"{via}policy_version__policy_id")),
        Q(tenant__isnull=True) | Q(tenant=F("record_tenant")) | Q(record_tenant=""),
        Q(released_at__isnull=True) | Q(released_at__gt=OuterRef(f"{via}committed_at")),
        overlaps,
        placed_at__lte=OuterRef(f"{via}committed_at"),
    )
    return holds


def reported_outcome(via: str = ""):
    """The record's outcome as an auditor reads it. The worker records every committed chunk
    as ``deleted``; one that deleted 0 rows is ``held`` when a legal hold covered it at the
    commit, else ``nothing eligible`` (its rows were gone or kept already). Partitions taken
    whole keep their own outcome (``dropped``, ``detached``). No record (a chunk not
    committed): NULL."""
    outcome, rows = f"{via}outcome", f"{via}rows_deleted"
    return Case(
        When(**{f"{outcome}__isnull": True}, then=Value(None)),
        When(~Q(**{outcome: "deleted"}) | Q(**{f"{rows}__gt": 0}), then=F(outcome)),
        When(hold_applied(via), then=Value(HELD)),
        default=Value(NOTHING_ELIGIBLE),
        output_field=TextField(),
    )


def csv_rows(filters: AuditFilters) -> Iterator[bytes]:
    """The CSV, produced by PostgreSQL itself (``COPY (…) TO STDOUT (FORMAT csv)``) and streamed
    block by block: constant memory, no per-row Python. Timestamps are formatted and formula
    cells neutralized in the query, so the bytes are final."""
    fields = {
        "committed_at_text": IsoText("committed_at"),
        "started_at_text": IsoText("started_at"),
        "cutoff_text": IsoText("cutoff"),
        **{f"partition_{k}": PartitionFact("partition", key=k) for k in PARTITION_KEYS},
        # '[...]' text: never read as a formula, whatever a text key holds
        "key_lo_text": Cast("key_lo", TextField()),
        "key_hi_text": Cast("key_hi", TextField()),
        "bounds_on_text": ColumnList("bound_columns"),
        "table_rows_text": Cast("table_rows", TextField()),
        "archive_objects_text": ArchiveObjects("archive", key="name"),
        "archive_rows_text": ArchiveRows("archive"),
        "archive_sha256_text": ArchiveObjects("archive", key="sha256"),
        "outcome_text": reported_outcome(),
        "rows_counted_text": Value(None, output_field=BigIntegerField()),
        "holds_text": holds_in_force(),
        "tenant_rows_text": Cast(
            Coalesce(
                "tenant_rows",
                Func(
                    Coalesce("tenant", Value("")),
                    "rows_deleted",
                    function="jsonb_build_object",
                    output_field=JSONField(),
                ),
            ),
            TextField(),
        ),  # fmt: skip
        "version_hash_text": Coalesce(
            NullIf("version_hash", Value("")),
            NullIf("policy_version__approved_hash", Value("")),
            "policy_version__content_hash",
        ),
        "version_name_text": SpecName("policy_version__spec"),
        "approved_at_text": IsoText("policy_version__decided_at"),
        "approved_by_name": Coalesce(
            Subquery(User.objects.filter(pk=OuterRef("approved_by_id")).values("username")[:1]),
            "policy_version__decided_by__username",
        ),
    }
    columns = []
    for name, field in CSV_COLUMNS:
        if name in TEXT_COLUMNS:
            fields[f"safe_{name}"] = Neutralized(field)
            field = f"safe_{name}"
        columns.append(field)
    query = audit_queryset(filters).annotate(**fields).values_list(*columns).query
    select_sql, params = query.sql_with_params()
    header = io.StringIO()
    csv.writer(header, lineterminator="\n").writerow([name for name, _ in CSV_COLUMNS])
    yield header.getvalue().encode()
    timeout_ms = settings.AUDIT_EXPORT_TIMEOUT_S * 1000
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT set_config('statement_timeout', %s, true)", [str(timeout_ms)])
            with cur.cursor.copy(f"COPY ({select_sql}) TO STDOUT (FORMAT csv)", params) as copy:
                for block in copy:
                    yield bytes(block)
        yield from counted_rows(filters)
    except (DatabaseError, psycopg.Error) as exc:  # COPY runs on psycopg's own cursor
        # the status line is long gone: say so in the file itself, as its last line
        canceled = isinstance(exc, QueryCanceled) or isinstance(exc.__cause__, QueryCanceled)
        why = "statement timeout" if canceled else type(exc).__name__
        yield f"ERROR: export incomplete ({why}); narrow the filters and export again\n".encode()


COUNTED = "counted"


def counted_rows(filters: AuditFilters) -> Iterator[bytes]:
    """The CSV lines of a count run's counted chunks, when the export is of one count run (its
    chunks have no audit record: nothing was deleted): one line per chunk in the audit
    columns, ``outcome`` "counted", ``rows_deleted`` 0 and ``rows_counted`` what the chunk's
    DELETE would have removed; its tenant rows as counted. Other selections: nothing."""
    run = filters.run_obj() if filters.run and not filters.errors else None
    if run is None or not run.counts_only or filters.policy or filters.date_from or filters.date_to:
        return
    version = run.policy_version
    chunks = Chunk.objects.filter(run=run, state=Chunk.State.DONE, counts__isnull=False)
    if filters.tenant:
        chunks = chunks.filter(tenant=filters.tenant)
    bounds_on = ", ".join(run.chunk_columns) if run.chunking == "timestamp" else ""
    values = {
        "policy": run.policy.slug, "policy_version": version.number,
        "version_hash": version.approved_hash or version.content_hash,
        "approved_by": version.decided_by.username if version.decided_by else "",
        "version_name": version.spec.get("name") or "", "approval_reason": version.decision_reason,
        "approved_at": _iso(version.decided_at) or "",
        "run_id": run.pk, "run_key": run.run_key, "rollout": run.rollout,
        "table": version.parsed.qualified_table, "bounds_on": bounds_on,
        "cutoff": _iso(run.bound), "rows_deleted": 0, "outcome": COUNTED,
    }  # fmt: skip
    names = [name for name, _ in CSV_COLUMNS]
    for chunk in chunks.order_by("id").iterator(chunk_size=BATCH):
        line = {
            **values,
            "chunk_id": chunk.pk,
            "tenant": chunk.tenant,
            "key_from": chunk.key_from,
            "key_to": chunk.key_to,
            "key_lo": json.dumps(chunk.lo) if chunk.lo is not None else "",
            "key_hi": json.dumps(chunk.hi) if chunk.hi is not None else "",
            "committed_at": _iso(chunk.done_at),
            "attempt": chunk.attempts,
            "rows_counted": chunk.counts.get("rows", 0),
            "tenant_rows": json.dumps(chunk.counts.get("tenants", {})),
        }
        out = io.StringIO()
        cells = [line.get(name, "") for name in names]
        cells = [
            _safe_cell(c) if n in TEXT_COLUMNS else c for n, c in zip(names, cells, strict=True)
        ]
        csv.writer(out, lineterminator="\n").writerow(cells)
        yield out.getvalue().encode()


def _safe_cell(value):
    """A free-text cell that a spreadsheet would read as a formula, quoted with ``'``
    (what ``Neutralized`` does in SQL)."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_response(filters: AuditFilters) -> HttpResponse:
    if filters.errors:
        text = "error: " + "\nerror: ".join(filters.errors) + "\n"
        return HttpResponse(text, status=400, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(csv_rows(filters), content_type="text/csv; charset=utf-8")
    run = filters.run_obj()
    narrowed = filters.policy or filters.tenant or filters.date_from or filters.date_to
    whole_run = run is not None and not narrowed
    # a run's whole trail is the run's evidence file; any other selection says its filters
    name = file_stem(run.run_key) if whole_run else f"audit_{filters.label()}"
    response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    response["Cache-Control"] = "no-store"
    return response


# ---------------------------------------------------------------- manifest


def _iso(value):
    return value.isoformat() if value is not None else None


def rehash_run_records(run: Run) -> dict:
    """Recompute each of the run's audit hashes from its content and recorded ``prev_hash``."""
    mismatched: list[int] = []
    checked = 0
    fields = audit.HASHED_COLUMNS
    for row in (
        AuditRecord.objects.filter(run=run).order_by("chain_seq").values(*fields).iterator(BATCH)
    ):
        checked += 1
        if audit.record_hash(row, row["prev_hash"]) != row["hash"] and len(mismatched) < 100:
            mismatched.append(row["chain_seq"])
    return {"records_checked": checked, "mismatched_seqs": mismatched, "ok": not mismatched}


MAX_RANGES = 1000  # a run interleaved with many others: its first ranges, and a count


def chain_ranges(run: Run, span: dict) -> dict:
    """Why a run's ``chain_seq`` has gaps: the chain is one sequence for every run, so records
    of runs committing at the same time sit between this run's. The run's records as
    contiguous ranges (gaps and islands, in SQL), and the other runs' records inside its span."""
    if not span["records"]:
        return {"run_seq_ranges": [], "other_runs_records_between": 0, "other_runs_between": []}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT min(chain_seq), max(chain_seq) FROM ("
            " SELECT chain_seq, chain_seq - row_number() OVER (ORDER BY chain_seq) AS island"
            " FROM runs_auditrecord WHERE run_id = %s) AS t"
            " GROUP BY island ORDER BY 1",
            [run.pk],
        )
        ranges = [[lo, hi] for lo, hi in cur.fetchall()]
    between = span["last_seq"] - span["first_seq"] + 1 - span["records"]
    others = (
        AuditRecord.objects.filter(chain_seq__range=(span["first_seq"], span["last_seq"]))
        .exclude(run_id=run.pk)
        .values("run_id", "run__run_key")
        .annotate(records=Count("id"))
        .order_by("run_id")[:100]
    )
    return {
        "run_seq_ranges": ranges[:MAX_RANGES],
        "run_seq_ranges_total": len(ranges),
        "other_runs_records_between": between,
        "other_runs_between": [
            {"id": o["run_id"], "run_key": o["run__run_key"], "records": o["records"]}
            for o in others
        ],
        "gaps_note": (
            "chain_seq is one sequence over the records of all runs; the numbers missing "
            "between this run's ranges are records of other runs committed meanwhile "
            "(other_runs_between), not removed records — `retention audit verify` checks "
            "the whole chain"
        ),
    }


def applied_holds(run: Run) -> list[dict]:
    """Legal holds that were in force on the run's policy (or all policies) at some moment
    of the run: placed before it ended, not released before it started."""
    start = run.started_at or run.created_at
    holds = LegalHold.objects.filter(
        Q(policy_id=run.policy_id) | Q(policy__isnull=True),
        Q(released_at__isnull=True) | Q(released_at__gte=start),
    ).select_related("policy")
    if run.finished_at is not None:
        holds = holds.filter(placed_at__lte=run.finished_at)
    return [
        {
            **h.scope(),
            "placed_at": _iso(h.placed_at),
            # releasing takes two people: who asked, and who approved (released_by)
            "release_requested_by": h.release_requested_by or None,
            "release_requested_at": _iso(h.release_requested_at),
            "release_request_reason": h.release_request_reason or None,
            "released_by": h.released_by or None,
            "released_at": _iso(h.released_at),
            "release_reason": h.release_reason or None,
        }
        for h in holds.order_by("placed_at", "id")
    ]


def run_actions(run: Run) -> list[dict]:
    """The operator log's entries on the run (confirm, pause, resume, cancel, …), in order."""
    rows = OperatorAction.objects.filter(target_type="run", target_id=str(run.pk))
    return [
        {
            "chain_seq": a.chain_seq,
            "at": _iso(a.at),
            "actor": a.actor,
            "action": a.action,
            "reason": a.reason,
            "details": a.details,
            "hash": a.hash,
        }
        for a in rows.order_by("chain_seq")
    ]


def manifest_header(run: Run) -> dict:
    version = run.policy_version
    progress = progress_for([run.pk], now=timezone.now())[run.pk]
    span = run.audit_records.aggregate(
        records=Count("id"), first_seq=Min("chain_seq"), last_seq=Max("chain_seq")
    )
    run_last = (
        run.audit_records.order_by("-chain_seq").values("chain_seq", "hash").first()
        if span["records"]
        else None
    )
    head = AuditRecord.objects.order_by("-chain_seq").values("chain_seq", "hash").first()
    return {
        "manifest": "retention-runner run evidence",
        "format": 1,
        "generated_at": _iso(timezone.now()),
        "run": {
            "id": run.pk,
            "run_key": run.run_key,
            "state": run.state,
            "state_reason": run.state_reason,
            "source": run.source,
            "tick": _iso(run.tick),
            "cutoff": _iso(run.cutoff),
            # the rollout stage: a slice run's DELETEs and verification used slice_bound;
            # a count run deleted nothing (totals.rows_counted: what a full run would delete)
            "rollout": run.rollout,
            "slice_bound": _iso(run.slice_bound),
            "created_at": _iso(run.created_at),
            "created_by": run.created_by,
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
            "passes": run.pass_no,
            "expected_rows": run.expected_rows,
            "skipped_ticks": run.skipped_ticks,
            # what its chunks run along and why (fixed at creation), and the columns every
            # chunk's key_lo/key_hi below are on (a partition's pass-0 chunk: the key's)
            "chunking": run.chunking,
            "chunking_reason": run.chunking_reason,
            "bounds_on": list(run.bound_columns(version.parsed)),
        },
        # the name the version was approved under (the policy may be called otherwise today)
        "policy": {
            "slug": run.policy.slug,
            "name": version.spec.get("name") or run.policy.name,
            "name_today": run.policy.name,
        },
        "policy_version": {
            "number": version.number,
            "state": version.state,
            "content_hash": version.content_hash,
            "approved_hash": version.approved_hash,
            "spec": version.spec,
        },
        "approval": {
            "author": version.author.username,
            "submitted_at": _iso(version.submitted_at),
            "approver": version.decided_by.username if version.decided_by else None,
            "approved_at": _iso(version.decided_at),
            "reason": version.decision_reason,
            "content_hash": version.approved_hash or version.content_hash,
        },
        "cutoff": _iso(run.cutoff),
        # the version's periods with the cutoff each had in this run's DELETEs (per tenant of
        # an override, per class), and every retention floor of the table
        "periods": periods_of(version.parsed, run.bound),
        # the floors and holds are the control database's decisions, wherever the run is
        "floors": _on_control(
            lambda: [floor_shown(f) for f in floors_of(version.parsed.schema, version.parsed.table)]
        ),
        "totals": {
            "chunks": dict(progress.chunks),
            # keys in the chunks' ranges when planned: what they could delete at most
            "planned_rows_up_to": progress.rows_planned,
            "rows_deleted": progress.rows_deleted,
            # every table the chunks' cascades reached, the policy's own included ({} without
            # cascading foreign keys): each record's table_rows summed
            "rows_removed_by_table": audit.rows_by_table(run.pk),
            # rows written to archive objects before their DELETE (each chunk's "archive")
            "rows_archived": archives.archived_rows(run.pk),
            "rows_expected": progress.rows_expected,
            "rows_expected_bound": progress.expected_bound,  # "~", "at least" or "up to"
            "percent": progress.percent,
            "audit_records": progress.audit_records,
            "first_committed_at": _iso(progress.first_commit),
            "last_committed_at": _iso(progress.last_commit),
            **counted_totals(run),
        },
        "verification": run.verification,
        # every dead letter of the run and what became of it: replayed or discarded, by whom,
        # when and why (a replayed chunk's audit record counts its attempts)
        "dead_letters": [
            {
                "id": d.pk,
                "chunk": d.chunk_id,
                "error_class": d.error_class,
                "sqlstate": d.sqlstate,
                "cause": (d.context or {}).get("cause"),
                "message": d.message,
                "attempts": d.attempts,
                "created_at": _iso(d.created_at),
                "resolution": d.resolution,
                "resolved_by": d.resolved_by or None,
                "resolved_at": _iso(d.resolved_at),
                "reason": d.resolution_reason or None,
            }
            for d in run.dead_letters.order_by("id")
        ],  # fmt: skip
        "partitions": [
            {
                "partition": f"{a.schema}.{a.name}",
                "bounds": a.bounds,
                "action": a.action,
                "state": a.state,
                "concurrently": a.concurrently,
                "rows": a.rows,
                "digest": f"md5:{a.digest}" if a.digest else None,
                "note": a.note,
                "chunk": a.chunk_id,
                "done_at": _iso(a.done_at),
                "dropped_at": _iso(a.dropped_at),  # a detached table dropped after its keep
            }
            for a in run.partition_actions.order_by("id")
        ],
        "audit_chain": {
            "head_seq": head["chain_seq"] if head else None,
            "head_hash": head["hash"] if head else audit.GENESIS,
            "run_first_seq": span["first_seq"],
            "run_last_seq": span["last_seq"],
            "run_last_hash": run_last["hash"] if run_last else None,
            "run_records": rehash_run_records(run),
            **chain_ranges(run, span),
        },
        "holds": _on_control(lambda: applied_holds(run)),
        "operator_actions": run_actions(run),
        **anchor_evidence(),
    }


def counted_totals(run: Run) -> dict:
    """A count run's totals for its manifest (``runs.counts``): rows a full run would delete,
    kept, held, deferred by cascades, and rows per tenant and month. Nothing for another run."""
    if not run.counts_only:
        return {}
    totals = count_totals(run)
    return {
        "rows_counted": totals["rows"],
        "rows_kept": totals["kept"],
        "rows_held": totals["held"],
        "rows_deferred_by_cascades": totals["cascade"],
        "rows_counted_by_tenant": totals["tenants"],
        "rows_counted_by_month": totals["ages"],
    }


def _on_control(read):
    """``read()`` on the control database, whichever target's ledger is in place."""
    with C.on(DEFAULT):
        return read()


def anchor_evidence() -> dict:
    """The latest signed checkpoint (taken by the checkpoint job; nothing is signed here) of
    the chains of the database in place — a target's is stored in the control database —
    the proof that both chains extend it up to their current heads, and one sentence on
    what that means — or that no checkpoint exists yet. Keep the file: `retention audit
    verify --against` it shows a later rewrite at or before the checkpoint's heads."""
    name = C.current()
    stored_as = "" if name == DEFAULT else name
    checkpoint = _on_control(lambda: evidence.latest_checkpoint(stored_as))
    return {
        "anchor": evidence.document(checkpoint) if checkpoint else None,
        "anchor_extension": evidence.extension(checkpoint) if checkpoint else None,
        "anchor_status": _on_control(lambda: evidence.status(checkpoint, target=stored_as)),
    }


CHUNK_FIELDS = [
    ("chunk", "id"),
    ("pass", "pass_no"),
    ("tenant", "tenant"),
    ("key_from", "key_from"),
    ("key_to", "key_to"),
    ("key_lo", "lo"),  # any key type: the key columns' texts; key_hi None: to the end
    ("key_hi", "hi"),
    ("state", "state"),
    ("attempts", "attempts"),
    # keys in the chunk's range when planned: an upper bound of its rows deleted
    ("planned_rows_up_to", "planned_rows"),
    ("rows_deleted", "audit__rows_deleted"),
    ("table_rows", "audit__table_rows"),  # rows removed per table, cascades included
    # archived before its DELETE: {"to", "objects": [{"name", "table", "rows", "sha256"}]}
    ("archive", "audit__archive"),
    ("outcome", "outcome_text"),  # deleted, held, nothing eligible (as the CSV); None: pending
    ("audit_seq", "audit__chain_seq"),
    ("audit_hash", "audit__hash"),
    ("committed_at", "audit__committed_at"),
    ("partition", "audit__partition"),  # a partition taken whole (pass 0): its record's facts
    ("counts", "counts"),  # a count run's chunk: what its DELETE would have removed
]


def manifest_chunks(run: Run) -> Iterator[dict]:
    """One entry per chunk; with ``interval``, its bounds as people read them, when they are
    on an epoch timestamp (``key_lo``/``key_hi`` keep the exact values the record hashes)."""
    names = [name for name, _ in CHUNK_FIELDS]
    spec = run.policy_version.parsed
    columns = run.bound_columns(spec)
    reader = (spec, columns) if spec.timestamp_unit and spec.timestamp in columns else None
    rows = (
        Chunk.objects.filter(run=run)
        .annotate(outcome_text=reported_outcome("audit__"))
        .order_by("id")
        .values_list(*[field for _, field in CHUNK_FIELDS])
    )
    for row in rows.iterator(chunk_size=BATCH):
        item = dict(zip(names, row, strict=True))
        item["committed_at"] = _iso(item["committed_at"])
        if item["archive"] is None:
            del item["archive"]
        if item["counts"] is None:
            del item["counts"]
        elif item["state"] == Chunk.State.DONE:
            item["outcome"] = COUNTED
        if reader is not None and item["key_lo"] is not None:
            lo, hi = tuple(item["key_lo"]), item["key_hi"] and tuple(item["key_hi"])
            item["interval"] = (
                f"[{show_bound(lo, reader=reader)}, {show_bound(hi, end=True, reader=reader)})"
            )
        yield item


def manifest_json(run: Run) -> Iterator[str]:
    """The manifest as JSON text, streamed: the header, then one entry per chunk.
    All of it is read in one transaction, so the header and the chunks agree."""
    with whole_result_cursor():
        header = json.dumps(manifest_header(run), indent=1, sort_keys=False)
        yield header[:-2] + ',\n "chunks": [\n'
        first = True
        batch: list[str] = []
        for item in manifest_chunks(run):
            batch.append(("  " if first else ",\n  ") + json.dumps(item))
            first = False
            if len(batch) >= BATCH:
                yield "".join(batch)
                batch = []
    batch.append("\n ]\n}\n")
    yield "".join(batch)


def manifest_on(target: str, run: Run) -> Iterator[str]:
    """``manifest_json`` of a run found on ``target``'s ledger, read there (the anchor, holds
    and floors from the control database)."""
    with C.on(target):
        try:
            yield from manifest_json(run)
        finally:
            if target != DEFAULT:
                C.close_all()


def manifest_response(run: Run, target: str = DEFAULT) -> StreamingHttpResponse:
    response = StreamingHttpResponse(manifest_on(target, run), content_type="application/json")
    name = file_stem(run.run_key)
    response["Content-Disposition"] = f'attachment; filename="{name}.manifest.json"'
    response["Cache-Control"] = "no-store"
    return response
