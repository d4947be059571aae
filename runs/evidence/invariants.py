"""The invariant checker: compares a run's table with its audit trail.

With a shadow copy of the table taken before the run (tests and drills keep
one), it proves exactly which rows are gone; without one it checks what the
ledger alone can prove (one audit row per finished chunk, chain intact,
nothing eligible left).

"Nothing eligible left" is judged for a drained run with the legal holds in force at its
verification (the ones its verification names): rows a hold deferred then stay for the next
run even after the hold's release, and a hold placed later excuses no row. Rows gone are
judged with the holds active now (or the ones a test states).

The expectation is computed here, independently of the engine's predicate
(``retention.predicate``): a row may go only when its timestamp is before the
run's cutoff (a ``timestamp without time zone`` read in the policy's zone, a ``date``
when the end of its day in that zone is not after the cutoff, an epoch number
converted by PostgreSQL's own ``extract(epoch …)``), every keep rule is definitely
false for it, its key is not NULL (nor its tenant, unless the policy says
``null_tenant = "delete"``), and no hold covers it, where a hold's tenant is compared
with the row's tenant by each column type's own ``=`` (the hold's value, or each part of
it, cast to the column's type). The cutoff itself is recomputed by PostgreSQL from the
run's tick: hours and minutes are elapsed time, days, weeks, months and years
wall-clock time in the policy's zone.

A partition the run took whole (``runs.engine.partitions``) must agree with its audit record and
ledger row: a dropped one is gone; a detached one is no longer attached and still holds the
rows (count, md5 of the ordered keys) its record names. Its rows count among the rows gone.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Max, Q
from psycopg import sql

from retention import decisions
from retention.models import LegalHold, PolicyVersion
from retention.spec import _RETENTION, months_before
from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, Chunk, PartitionAction, Run

ROW = sql.Identifier("r")

# A row whose tenant (in a policy with a tenant) is NULL is never eligible, like a row
# whose key or timestamp is NULL (docs/engine.md, "NULLs") — unless the policy says
# null_tenant = "delete".
NULL_TENANT_DELETABLE = False
# Seconds per unit of an epoch timestamp column.
PER_SECOND = {"s": 1, "ms": 1000, "us": 1_000_000}
# A hold naming a tenant cannot be matched on a policy without a tenant column; it is
# decided conservatively: it covers every row of that policy.
TENANT_HOLD_COVERS_TENANTLESS_POLICY = True

_LIST_OPS = {"in": "IN", "not in": "NOT IN"}
_COMPARE = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


@dataclasses.dataclass(frozen=True)
class Shadow:
    """A copy of the target table and the audit-chain position when it was taken: rows gone
    since then must match the audit rows after ``after_seq``."""

    schema: str
    table: str
    after_seq: int | None = None  # None: every audit row of the policy on this table


@dataclasses.dataclass(frozen=True)
class HoldScope:
    """What one hold protects (None: unbounded). ``tenant`` is compared in the column's type."""

    tenant: str | None = None
    key_from: int | None = None
    key_to: int | None = None


def take_shadow(schema: str, table: str, name: str) -> Shadow:
    """Copy ``schema.table`` into ``schema.name`` now, remembering the audit-chain position."""
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("DROP TABLE IF EXISTS {}")
            .format(sql.Identifier(schema, name))
            .as_string(cur.connection)
        )
        cur.execute(
            sql.SQL("CREATE TABLE {} AS SELECT * FROM {}")
            .format(sql.Identifier(schema, name), sql.Identifier(schema, table))
            .as_string(cur.connection)
        )
    seq = AuditRecord.objects.aggregate(m=Max("chain_seq"))["m"] or 0
    return Shadow(schema, name, seq)


def _scalar(query: sql.Composable, params: list):
    with connection.cursor() as cur:
        cur.execute(query.as_string(cur.connection), params)
        return cur.fetchone()


def _column_types(schema: str, table: str) -> dict[str, tuple[str, str, str, str]]:
    """column → (schema of its type, type name, format_type, the base type's name: a domain's
    base type, else the type name)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT a.attname, n.nspname, t.typname, format_type(a.atttypid, NULL),"
            " CASE WHEN t.typtype = 'd' THEN (SELECT b.typname FROM pg_type b"
            "  WHERE b.oid = t.typbasetype) ELSE t.typname END"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace cn ON cn.oid = c.relnamespace"
            " JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace n ON n.oid = t.typnamespace"
            " WHERE cn.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
            [schema, table],
        )
        return {name: (nsp, typ, fmt, base) for name, nsp, typ, fmt, base in cur.fetchall()}


def _casts(value: str, type_ident: sql.Composable) -> bool:
    """Whether ``value`` is a value of the type (its input function accepts it)."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT CAST(%s AS {})").format(type_ident).as_string(cur.connection),
                [value],
            )
        return True
    except DatabaseError:
        return False


def _retention_parts(retention: str) -> tuple[int, str]:
    match = _RETENTION.fullmatch(retention)
    return int(match.group(1)), match.group(2)


def _is_wall_clock_edge(tick: datetime, retention: str, tz: str) -> bool:
    """Whether tick − retention falls on a local time that DST skips or repeats (a convention,
    not a fact: the engine and PostgreSQL may resolve it differently)."""
    number, unit = _retention_parts(retention)
    if unit not in {"day", "week", "month", "year"} or number == 0:
        return False
    zone = ZoneInfo(tz)
    local = tick.astimezone(zone).replace(tzinfo=None)
    if unit in {"month", "year"}:  # the day is clamped, the wall-clock time kept
        local = months_before(local, number * (12 if unit == "year" else 1))
    else:
        local -= timedelta(days=number * (7 if unit == "week" else 1))
    return (
        local.replace(tzinfo=zone, fold=0).utcoffset()
        != local.replace(tzinfo=zone, fold=1).utcoffset()
    )


def expected_cutoff(run: Run) -> datetime | None:
    """The cutoff as PostgreSQL computes it from the tick: the retention's years, months, weeks
    and days are subtracted on the policy's wall clock, its hours and minutes as elapsed time.
    None when the result falls on a skipped or repeated local time."""
    spec = run.policy_version.parsed
    if _is_wall_clock_edge(run.tick, spec.retention, spec.timezone):
        return None
    return _pg_before(run.tick, spec.retention, spec.timezone)


def period_cutoff(run: Run, period: str) -> datetime | None:
    """An override's or a class's cutoff, computed like ``expected_cutoff`` from the tick
    (a slice run's: that minus ``slice``); None for "forever"."""
    spec = run.policy_version.parsed
    if period == "forever":
        return None
    cutoff = _pg_before(run.tick, period, spec.timezone)
    if run.rollout == "slice" and spec.slice:
        cutoff = _pg_before(cutoff, spec.slice, spec.timezone)
    return cutoff


def _pg_before(tick: datetime, retention: str, timezone_name: str) -> datetime:
    # the calendar part of the interval (years, months, days) on the zone's wall clock,
    # the rest (hours, minutes) as elapsed time
    (cutoff,) = _scalar(
        sql.SQL(
            "SELECT (((%s::timestamptz AT TIME ZONE %s) - q.c)"
            " AT TIME ZONE %s) - (q.r - q.c)"
            " FROM (SELECT r, make_interval(months => extract(year FROM r)::int * 12"
            "  + extract(month FROM r)::int, days => extract(day FROM r)::int) AS c"
            "  FROM (SELECT %s::interval AS r) AS i) AS q"
        ),
        [tick, timezone_name, timezone_name, "{} {}s".format(*_retention_parts(retention))],
    )
    return cutoff


def naive_timestamp_zone(spec) -> str:
    """The zone a ``timestamp without time zone`` column's values are read in."""
    return spec.timestamp_zone or spec.timezone


class Oracle:
    """SQL conditions on a row ``r`` of the policy's table, composed from the spec alone."""

    def __init__(self, run: Run, holds: list[HoldScope] | None = None, cutoff=None):
        self.run = run
        self.spec = spec = run.policy_version.parsed
        self.cutoff = cutoff or run.cutoff
        self.types = _column_types(spec.schema, spec.table)
        self.holds = holds if holds is not None else active_holds(run)

    @classmethod
    def of_policy(cls, version, *, tick: datetime) -> Oracle:
        """The oracle of another approved policy version: its cutoff for ``tick``, the holds
        active now that apply to it."""
        oracle = cls.__new__(cls)
        oracle.spec = spec = version.parsed
        oracle.cutoff = spec.cutoff_for(tick)
        oracle.types = _column_types(spec.schema, spec.table)
        oracle.holds = _holds_of(version.policy_id)
        return oracle

    def col(self, name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(ROW, sql.Identifier(name))

    def type_ident(self, column: str) -> sql.Composable:
        nsp, typ = self.types[column][:2]
        return sql.Identifier(nsp, typ)

    def old(self) -> tuple[sql.Composable, list]:
        """Older than its own period's cutoff: the longest of its tenant's override and its
        class, else the default (``self.cutoff``)."""
        spec = self.spec
        run = getattr(self, "run", None)
        if run is None or not (spec.overrides or spec.classes):
            return self.old_at(self.cutoff)
        applies: list[tuple[sql.Composable, list, datetime | None]] = []
        for o in spec.overrides:
            name = spec.tenant_columns[0]
            applies.append((
                sql.SQL("({} = ANY (%s::text[]::{}[])) IS TRUE").format(
                    self.col(name), self.type_ident(name)),
                [list(o.tenants)], period_cutoff(run, o.retention),
            ))  # fmt: skip
        for c in spec.classes:
            applies.append((
                sql.SQL("({} = %s) IS TRUE").format(self.col(c.column)), [c.value],
                period_cutoff(run, c.retention),
            ))  # fmt: skip
        parts, params = [], []
        for match, p, cutoff in applies:  # every period that applies lets the row go
            if cutoff is None:
                parts.append(sql.SQL("NOT {}").format(match))
                params += p
            else:
                older, p2 = self.old_at(cutoff)
                parts.append(sql.SQL("(NOT {} OR ({}) IS TRUE)").format(match, older))
                params += p + p2
        default, p3 = self.old_at(self.cutoff)
        none_applies = sql.SQL(" OR ").join(m for m, _, _ in applies)
        return (
            sql.SQL("({} AND (({}) OR ({}) IS TRUE))").format(
                sql.SQL(" AND ").join(parts), none_applies, default
            ),
            params + [x for _, p, _ in applies for x in p] + p3,
        )

    def old_at(self, cutoff) -> tuple[sql.Composable, list]:
        ts = self.col(self.spec.timestamp)
        fmt = self.types[self.spec.timestamp][2]
        unit = getattr(self.spec, "timestamp_unit", None)
        if unit:  # seconds since the epoch, exactly, as PostgreSQL counts them
            # a floating-point number by its shortest exact text (a cast to numeric keeps
            # only 15 digits: a microsecond of a present-day time in seconds is the 16th)
            exact = (
                "{}::float8::text::numeric"
                if self.types[self.spec.timestamp][3] in ("float8", "float4")
                else "{}::numeric"
            )
            return (
                sql.SQL(exact + " < extract(epoch FROM %s::timestamptz) * %s").format(ts),
                [cutoff, PER_SECOND[unit]],
            )
        if self.types[self.spec.timestamp][3] == "date":
            # a day is past the cutoff when its end (the next midnight in the zone) is
            return (
                sql.SQL("({} + 1)::timestamp <= (%s::timestamptz AT TIME ZONE %s)").format(ts),
                [cutoff, naive_timestamp_zone(self.spec)],
            )
        if fmt == "timestamp with time zone":
            return sql.SQL("{} < %s").format(ts), [cutoff]
        # wall-clock time in the zone: older when it reads earlier than the cutoff's local
        # time there (a time the clocks repeat is compared as it reads, not guessed)
        zone = naive_timestamp_zone(self.spec)
        return (
            sql.SQL("{}::timestamp < (%s::timestamptz AT TIME ZONE %s)").format(ts),
            [cutoff, zone],
        )

    def kept(self) -> tuple[sql.Composable, list]:
        """Some rule protects the row: it is TRUE or cannot be decided (NULL)."""
        if not self.spec.keep:
            return sql.SQL("FALSE"), []
        parts, params = [], []
        for rule in self.spec.keep:
            c = self.col(rule.column)
            if rule.op == "is null":
                parts.append(sql.SQL("{} IS NULL").format(c))
            elif rule.op == "is not null":
                parts.append(sql.SQL("{} IS NOT NULL").format(c))
            elif rule.op in _LIST_OPS:
                marks = sql.SQL(", ").join(sql.Placeholder() * len(rule.values))
                parts.append(sql.SQL("{} " + _LIST_OPS[rule.op] + " ({})").format(c, marks))
                params += list(rule.values)
            else:
                parts.append(sql.SQL("{} " + _COMPARE[rule.op] + " %s").format(c))
                params.append(rule.value)
        return sql.SQL("(({}) IS NOT FALSE)").format(sql.SQL(" OR ").join(parts)), params

    def integer_key(self) -> bool:
        """One integer key column (a domain over an integer type is one: its base decides)."""
        cols = self.spec.key_columns
        return len(cols) == 1 and self.types[cols[0]][3] in ("int2", "int4", "int8")

    def held(self) -> tuple[sql.Composable, list]:
        """A hold's key interval (integers) applies to one integer key column; on any other
        key the hold covers every row of its tenant (the conservative reading)."""
        parts, params = [], []
        key = self.col(self.spec.key_columns[0])
        by_key = self.integer_key()
        tenant_cols = self.tenant_columns()
        for hold in self.holds:
            conds, p = [], []
            if hold.tenant is not None:
                if not tenant_cols:
                    if not TENANT_HOLD_COVERS_TENANTLESS_POLICY:
                        continue
                else:
                    values = _hold_parts(hold.tenant, len(tenant_cols))
                    if values is None:
                        pass  # one value cannot name a tenant of several columns: all rows
                    elif not all(
                        _casts(v, self.type_ident(c))
                        for v, c in zip(values, tenant_cols, strict=True)
                    ):
                        continue  # no row's tenant equals a value the type cannot hold
                    else:
                        for v, c in zip(values, tenant_cols, strict=True):
                            conds.append(
                                sql.SQL("{} = CAST(%s AS {})").format(
                                    self.col(c), self.type_ident(c)
                                )
                            )
                            p.append(v)
            if hold.key_from is not None and by_key:
                conds.append(sql.SQL("{} >= %s").format(key))
                p.append(hold.key_from)
            if hold.key_to is not None and by_key:
                conds.append(sql.SQL("{} < %s").format(key))
                p.append(hold.key_to)
            parts.append(sql.SQL(" AND ").join(conds) if conds else sql.SQL("TRUE"))
            params += p
        if not parts:
            return sql.SQL("FALSE"), []
        joined = sql.SQL(" OR ").join(sql.SQL("({})").format(x) for x in parts)
        return sql.SQL("(({}) IS TRUE)").format(joined), params

    def tenant_columns(self) -> tuple[str, ...]:
        tenant = self.spec.tenant
        if not tenant:
            return ()
        return tuple(tenant) if isinstance(tenant, list | tuple) else (tenant,)

    def null_tenant_deletable(self) -> bool:
        return NULL_TENANT_DELETABLE or getattr(self.spec, "null_tenant", "keep") == "delete"

    def unplannable(self) -> tuple[sql.Composable, list]:
        """Rows no chunk can name: a NULL key (and, unless the policy deletes rows without a
        tenant, a NULL tenant or part of one)."""
        parts = [sql.SQL("{} IS NULL").format(self.col(k)) for k in self.spec.key_columns]
        if not self.null_tenant_deletable():
            parts += [sql.SQL("{} IS NULL").format(self.col(c)) for c in self.tenant_columns()]
        return sql.SQL("({})").format(sql.SQL(" OR ").join(parts)), []

    def deletable(self) -> tuple[sql.Composable, list]:
        old, p1 = self.old()
        kept, p2 = self.kept()
        held, p3 = self.held()
        unpl, p4 = self.unplannable()
        return (
            sql.SQL("(({}) IS TRUE AND NOT {} AND NOT {} AND NOT {})").format(
                old, kept, held, unpl
            ),
            p1 + p2 + p3 + p4,
        )


def _hold_parts(text: str, columns: int) -> list[str] | None:
    """A hold's tenant as one value per tenant column; None when it names one value for a
    tenant of several columns (such a hold covers every row of the policy)."""
    if columns == 1:
        return [text]
    if text.startswith("["):
        parts = json.loads(text)
        if len(parts) != columns:
            raise ValueError(f"hold tenant {text!r} does not name {columns} parts")
        return [str(p) for p in parts]
    return None


def active_holds(run: Run, *, ids=None) -> list[HoldScope]:
    return _holds_of(run.policy_id, ids=ids)


def _holds_of(policy_id: int, *, ids=None) -> list[HoldScope]:
    # a release that does not verify leaves its hold in force (retention.decisions)
    in_force = Q(released_at__isnull=True) | ~Q(pk__in=decisions.verified_release_ids())
    qs = LegalHold.objects.filter(in_force).filter(Q(policy__isnull=True) | Q(policy_id=policy_id))
    if ids is not None:
        qs = qs.filter(pk__in=list(ids))
    return [HoldScope(h.tenant, h.key_from, h.key_to) for h in qs.order_by("pk")]


def verified_holds(run: Run) -> tuple[list[HoldScope], list[str]]:
    """The legal holds a drained run's leftover rows are judged by, and any problem with them:
    the holds in force when its last verification counted the rows. A hold released after that
    verification leaves its rows to the policy's next run (they were held when the run was
    declared drained); a hold placed after it excuses nothing.

    The verification names its holds (``holds``: the ids its statement read, in its own
    snapshot). Each must be a hold of the ledger that applies to the run's policy and was
    placed before the verification's ``checked_at``, whatever has become of it since. A
    verification recorded before it named its holds is read by the ledger's times: the holds
    placed by ``checked_at`` and not released by then."""
    result = run.verification or {}
    checked_at = datetime.fromisoformat(result["checked_at"])
    applies = Q(policy__isnull=True) | Q(policy_id=run.policy_id)
    if "holds" not in result:
        qs = LegalHold.objects.filter(applies, placed_at__lte=checked_at).filter(
            Q(released_at__isnull=True) | Q(released_at__gt=checked_at)
        )
        return [HoldScope(h.tenant, h.key_from, h.key_to) for h in qs.order_by("pk")], []
    named = [int(pk) for pk in result["holds"]]
    found = {h.pk: h for h in LegalHold.objects.filter(pk__in=named)}
    problems, scopes = [], []
    for pk in named:
        hold = found.get(pk)
        if hold is None:
            problems.append(f"the verification names hold #{pk}, which does not exist")
        elif hold.policy_id not in (None, run.policy_id):
            problems.append(f"the verification names hold #{pk}, which is another policy's")
        elif hold.placed_at > checked_at:
            problems.append(f"the verification names hold #{pk}, placed after it")
        else:
            scopes.append(HoldScope(hold.tenant, hold.key_from, hold.key_to))
    return scopes, problems


def _ledger_problems(run: Run, *, chain: bool = True) -> list[str]:
    problems: list[str] = []
    done = set(Chunk.objects.filter(run=run, state=Chunk.State.DONE).values_list("id", flat=True))
    if run.counts_only:  # a count run's chunks count and delete nothing: no audit row each
        uncounted = Chunk.objects.filter(run=run, state=Chunk.State.DONE, counts__isnull=True)
        if uncounted.exists():
            problems.append(f"{uncounted.count()} finished chunk(s) of a count run without counts")
        if AuditRecord.objects.filter(run=run).exists():
            problems.append("a count run has audit rows: it deleted rows")
        if chain:
            problems.extend(f"audit chain: {p}" for p in verify_chain().problems)
        return problems
    audited = dict(
        AuditRecord.objects.filter(run=run)
        .values_list("chunk_id")
        .annotate(n=Count("id"))
        .values_list("chunk_id", "n")
    )
    if set(audited) != done:
        missing, extra = done - set(audited), set(audited) - done
        if missing:
            problems.append(f"{len(missing)} finished chunk(s) without an audit row")
        if extra:
            problems.append(f"{len(extra)} audit row(s) for chunks that are not done")
    if any(n != 1 for n in audited.values()):
        problems.append("a chunk has more than one audit row")
    if chain:
        problems.extend(f"audit chain: {p}" for p in verify_chain().problems)
    return problems


def _partition_problems(run: Run, spec) -> list[str]:
    """Each partition the run took whole: its audit record, its ledger row and the table agree
    — a dropped partition is gone; a detached one is no longer attached and still holds exactly
    the rows (count and md5 of the ordered keys) its record names."""
    problems: list[str] = []
    actions = {
        f"{a.schema}.{a.name}": a
        for a in PartitionAction.objects.filter(run=run, state__in=["dropped", "detached"])
    }
    records = AuditRecord.objects.filter(run=run, partition__isnull=False)
    seen = set()
    parent = sql.Identifier(spec.schema, spec.table)
    for record in records:
        facts = record.partition
        name = facts["name"]
        seen.add(name)
        action = actions.get(name)
        if action is None or action.state != facts["action"] or action.chunk_id != record.chunk_id:
            problems.append(f"partition {name}: the audit record and the ledger disagree")
        if record.rows_deleted != facts["rows"]:
            problems.append(
                f"partition {name}: {record.rows_deleted} rows audited, {facts['rows']} named"
            )
        schema, table = name.split(".", 1)
        (exists, is_attached) = _scalar(
            sql.SQL(
                "SELECT to_regclass(%s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_inherits"
                " WHERE inhrelid = to_regclass(%s) AND inhparent = to_regclass(%s))"
            ),
            [sql.Identifier(schema, table).as_string(connection.connection)] * 2
            + [parent.as_string(connection.connection)],
        )
        if facts["action"] == "dropped":
            if exists:
                problems.append(f"partition {name} was audited as dropped but still exists")
            continue
        if action is not None and action.dropped_at is not None:
            # dropped by the reconciler once the policy's detached_keep had passed
            if exists:
                problems.append(f"detached partition {name} was recorded as dropped but exists")
            continue
        if not exists:
            problems.append(f"detached partition {name} is gone")
            continue
        if is_attached:
            problems.append(f"partition {name} was audited as detached but is attached")
        key = sql.SQL(", ").join(sql.Identifier(c) for c in spec.key_columns)
        if len(spec.key_columns) > 1:
            key = sql.SQL("({})").format(key)
        rows, digest = _scalar(
            sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg({k}::text, ',' ORDER BY {k}), ''))"
                " FROM {t}"
            ).format(k=key, t=sql.Identifier(schema, table)),
            [],
        )
        if rows != facts["rows"] or f"md5:{digest}" != facts["digest"]:
            problems.append(
                f"detached partition {name} holds {rows} row(s) with digest md5:{digest}, its "
                f"record names {facts['rows']} with digest {facts['digest']}"
            )
    for name in sorted(set(actions) - seen):
        problems.append(f"partition {name} was {actions[name].state} without an audit record")
    if run.state == Run.State.DRAINED:
        # a run settles its partitions before it plans: one drained has none half-detached
        for schema, table in PartitionAction.objects.filter(
            run=run, state=PartitionAction.State.DETACHING
        ).values_list("schema", "name"):
            problems.append(f"partition {schema}.{table} is still being detached by a drained run")
    return problems


def check_run(
    run: Run,
    *,
    shadow: tuple[str, str] | Shadow | None = None,
    expect_drained: bool = True,
    holds: list[HoldScope] | None = None,
    cascaded: dict[str, tuple[str, str] | Shadow] | None = None,
    chain: bool = True,
) -> list[str]:
    """Return the list of broken invariants (empty when all hold).

    ``holds`` overrides the holds read from the ledger (a test states what it placed, as it
    wrote it); by default every active hold that applies to the run's policy counts — except
    for the rows a drained run left, which are judged by the holds in force at its
    verification (``verified_holds``). ``cascaded``: shadow copies of tables that reference
    the run's table through cascading foreign keys, by ``"schema.table"`` — their rows gone
    must equal the audited rows of that table, and none of them may be one an approved
    policy of that table protects (``cascade_problems``). ``chain=False`` leaves out the walk
    of the whole audit chain (``verify_chain``), for a caller that checks after every step
    and walks it once at the end: the chain is append-only, so a break stays until then."""
    run = Run.objects.select_related("policy_version").get(pk=run.pk)
    spec = run.policy_version.parsed
    problems = _ledger_problems(run, chain=chain)
    problems += _partition_problems(run, spec)

    expected = expected_cutoff(run)
    if expected is not None and expected != run.cutoff:
        problems.append(
            f"the run's cutoff {run.cutoff.isoformat()} is not tick − {spec.retention}"
            f" in {spec.timezone} = {expected.isoformat()}"
        )

    if run.rollout == "slice" and expected is not None:
        # a slice run deletes rows older than cutoff − slice, computed here from the spec
        expected = spec.slice_bound(expected)
        if expected != run.slice_bound:
            problems.append(
                f"the run's slice bound {run.slice_bound} is not cutoff − {spec.slice}"
                f" = {expected.isoformat()}"
            )
    # Rows are judged against the cutoff the tick and retention give, not the stored one.
    oracle = Oracle(run, holds, cutoff=expected)
    target = sql.SQL("{} AS {}").format(sql.Identifier(spec.schema, spec.table), ROW)
    if expect_drained:
        verified = run.state == Run.State.DRAINED and "checked_at" in (run.verification or {})
        judge = oracle
        if holds is None and verified:
            at_verification, hold_problems = verified_holds(run)
            problems += hold_problems
            judge = Oracle(run, at_verification, cutoff=expected)
        cond, params = judge.deletable()
        (left,) = _scalar(
            sql.SQL("SELECT count(*) FROM {} WHERE {} AND {}").format(
                target, cond, _unreferenced(spec)
            ),
            params,
        )
        if left:
            problems.append(f"{left} eligible row(s) still present under the cutoff")

    if shadow is not None:
        if not isinstance(shadow, Shadow):
            shadow = Shadow(*shadow)
        problems += _shadow_problems(run, spec, oracle, shadow)
    for name, copy in (cascaded or {}).items():
        if not isinstance(copy, Shadow):
            copy = Shadow(*copy)
        problems += cascade_problems(run, name, copy)
    return problems


def _cascading_keys(
    schema: str, table: str, actions: tuple[str, ...] = ("c",)
) -> list[tuple[str, str, list[str], list[str]]]:
    """The ``ON DELETE CASCADE`` foreign keys referencing ``schema.table`` (``actions``: those
    with these ``confdeltype``s), from the catalog: (referencing schema, table, its columns,
    the referenced columns)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT n.nspname, c.relname,"
            " ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(n, o)"
            "  JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n ORDER BY k.o),"
            " ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY AS k(n, o)"
            "  JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n ORDER BY k.o)"
            " FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE con.contype = 'f' AND con.confdeltype = ANY(%s) AND con.conparentid = 0"
            " AND con.confrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))",
            [list(actions), schema, table],
        )
        return [(n, t, list(cols), list(refs)) for n, t, cols, refs in cur.fetchall()]


def _unreferenced(spec) -> sql.Composable:
    """No row still present references row ``r`` through a cascading foreign key, nor through
    one that forbids its deletion (``NO ACTION``, ``RESTRICT``: another table's, or the
    table's own). An eligible row that one does reference may stay: deleting it would delete
    that row too, which may be protected (docs/policies.md, "Cascades"), or cannot be done
    while the row stays (a row that stays keeps what it references), so it is not counted as
    left behind."""
    parts = []
    for schema, table, cols, refs in _cascading_keys(spec.schema, spec.table, ("c", "a", "r")):
        y = sql.Identifier("y")
        match = sql.SQL(" AND ").join(
            sql.SQL("{}.{} = {}.{}").format(y, sql.Identifier(c), ROW, sql.Identifier(r))
            for c, r in zip(cols, refs, strict=True)
        )
        parts.append(
            sql.SQL("NOT EXISTS (SELECT 1 FROM {} AS {} WHERE {})").format(
                sql.Identifier(schema, table), y, match
            )
        )
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE")


def audited_rows(name: str, *, after_seq: int | None = None, slug: str | None = None) -> int:
    """Rows the audit trail says left table ``name``: a record's ``table_rows`` entry for it
    (its own DELETE and every cascade), or, for a record without them, its ``rows_deleted``
    when it is the record's own table. ``slug``: only that policy's records of its own table
    and the cascades of any policy's records into it."""
    records = AuditRecord.objects.filter(Q(table_name=name) | Q(table_rows__has_key=name))
    if slug is not None:
        records = records.filter(Q(policy_slug=slug) | Q(table_rows__has_key=name))
    if after_seq is not None:
        records = records.filter(chain_seq__gt=after_seq)
    total = 0
    for table_name, rows, by_table in records.values_list(
        "table_name", "rows_deleted", "table_rows"
    ).iterator():
        if by_table is not None:
            total += int(by_table.get(name, 0))
        elif table_name == name:
            total += rows
    return total


def _gone(shadow: Shadow, schema: str, table: str, present=()) -> sql.Composable:
    """The shadow's rows that are no longer in ``schema.table`` (nor in ``present``), as a
    multiset of whole rows turned back into rows of the shadow's type, under alias ``r``."""
    shadow_table = sql.Identifier(shadow.schema, shadow.table)
    tables = [sql.Identifier(schema, table), *present]
    return sql.SQL(
        "(SELECT (g.k::{rowtype}).* FROM (SELECT x::text AS k FROM {shadow} AS x"
        " EXCEPT ALL ({present})) AS g) AS {r}"
    ).format(
        rowtype=shadow_table,
        shadow=shadow_table,
        present=sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT y::text FROM {} AS y").format(t) for t in tables
        ),
        r=ROW,
    )


def cascade_problems(run: Run, name: str, shadow: Shadow) -> list[str]:
    """A table that the run's table's cascades reach, against its shadow copy: the rows gone
    equal the rows audited for it, and none of them is one that an approved policy of that
    table protects (younger than its cutoff for the run's tick, kept by its keep rules, held
    by a hold applying to it, or without a key or tenant)."""
    schema, table = name.split(".", 1)
    gone = _gone(shadow, schema, table)
    (gone_count,) = _scalar(sql.SQL("SELECT count(*) FROM {}").format(gone), [])
    problems = []
    audited = audited_rows(name, after_seq=shadow.after_seq)
    if gone_count != audited:
        problems.append(f"{name}: {gone_count} row(s) gone but {audited} audited")
    for version in PolicyVersion.objects.filter(state=PolicyVersion.State.APPROVED):
        spec = version.parsed
        if spec.qualified_table != name or version.policy_id == run.policy_id:
            continue
        oracle = Oracle.of_policy(version, tick=run.tick)
        deletable, params = oracle.deletable()
        (protected,) = _scalar(
            sql.SQL("SELECT count(*) FROM {} WHERE NOT {}").format(gone, deletable), params
        )
        if protected:
            problems.append(
                f"{name}: {protected} row(s) that policy {spec.slug} protects (newer than its "
                f"cutoff, kept or held) are gone"
            )
    return problems


def _out_of_sight(run: Run) -> list[tuple[str, str]]:
    """Partitions of the run's table that hold rows no longer gone from the database, though
    a read of the table does not see them: one an operator kept detached (it could not be put
    back; its rows neither deleted nor audited), and one a run of the policy is detaching (the
    detach has committed, its drop and audit record not yet: its rows moved, none deleted —
    ``runs.engine.partitions``). Only those that still exist and are not attached, or are
    DETACH PENDING (out of the table's sight too)."""
    out = []
    for schema, name in (
        PartitionAction.objects.filter(
            run__policy_id=run.policy_id,
            state__in=[PartitionAction.State.KEPT, PartitionAction.State.DETACHING],
        )
        .values_list("schema", "name")
        .distinct()
    ):
        (apart,) = _scalar(
            sql.SQL(
                "SELECT to_regclass(%s) IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_inherits"
                " WHERE inhrelid = to_regclass(%s) AND NOT inhdetachpending)"
            ),
            [sql.Identifier(schema, name).as_string(connection.connection)] * 2,
        )
        if apart:
            out.append((schema, name))
    return out


def _shadow_problems(run: Run, spec, oracle: Oracle, shadow: Shadow) -> list[str]:
    problems: list[str] = []
    # Rows gone: the shadow's rows minus the table's, as a multiset of whole rows (NULL keys
    # and duplicate keys included), turned back into rows of the shadow's type.
    # A partition an operator kept detached (it could not be put back), or one a run is
    # detaching (its audit record commits with its drop), still holds its rows: they are not
    # gone (and not audited).
    gone = _gone(
        shadow,
        spec.schema,
        spec.table,
        [sql.Identifier(schema, name) for schema, name in _out_of_sight(run)],
    )
    old, p_old = oracle.old()
    kept, p_kept = oracle.kept()
    held, p_held = oracle.held()
    unpl, p_unpl = oracle.unplannable()
    deletable, p_del = oracle.deletable()
    row = _scalar(
        sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE NOT {d}),"
            " count(*) FILTER (WHERE ({o}) IS NOT TRUE), count(*) FILTER (WHERE {k}),"
            " count(*) FILTER (WHERE {h}), count(*) FILTER (WHERE {u}) FROM {gone}"
        ).format(d=deletable, o=old, k=kept, h=held, u=unpl, gone=gone),
        p_del + p_old + p_kept + p_held + p_unpl,
    )
    gone_count, outside, newer, n_kept, n_held, n_unpl = row
    # the policy's own records of its table, each with every row its cascades removed there,
    # and any other policy's cascades into it
    audited = audited_rows(spec.qualified_table, after_seq=shadow.after_seq, slug=spec.slug)
    if gone_count != audited:
        problems.append(f"{gone_count} row(s) gone but {audited} audited")
    if outside:
        problems.append(
            f"{outside} row(s) outside the run's scope (newer, kept or held) are gone:"
            f" {newer} not older than the cutoff, {n_kept} kept, {n_held} held,"
            f" {n_unpl} with a NULL key{' or tenant' if not oracle.null_tenant_deletable() else ''}"
        )
    return problems
