"""Validate a policy spec against the live catalog.

The parser (``retention.spec``) checks shape; this module checks that the table
and columns exist with compatible types, that keep-rule values are comparable
with their columns, which indexes support the chunk plan, and which foreign keys
reference the target. Names are looked up in ``pg_catalog`` with bound
parameters; the only statements on the user table are ``LIMIT 0`` probes built
by ``retention.predicate``.

Errors raise ``SpecError`` (one line, naming the table or column); everything
that would still let a run proceed, but badly, is returned as a warning.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from core import timeouts
from database.schema import product_table_names
from retention import archive_tables, cascades, holds, partitions, predicate
from retention.spec import PolicySpec, SpecError, did_you_mean

KEY_TYPES = ("int2", "int4", "int8")
TIMESTAMP_TYPES = ("timestamptz", "timestamp", "date")
# An epoch timestamp (``timestamp_unit``): time since the Unix epoch in a number column.
EPOCH_TYPES = ("int8", "int4", "numeric", "float8", "float4")
# The units each integer type holds a present-day time in (int4: seconds, until 2038).
EPOCH_UNITS_OF = {
    "int8": ("s", "ms", "us"),
    "int4": ("s",),
    "numeric": ("s", "ms", "us"),
    "float8": ("s", "ms", "us"),  # a recorder's ``last_updated_ts``: seconds with a fraction
    "float4": ("s", "ms", "us"),  # compared exactly, though it stores a present-day time coarsely
}
# pg_constraint.confdeltype
ON_DELETE = {
    "a": "no action",
    "r": "restrict",
    "c": "cascade",
    "n": "set null",
    "d": "set default",
}


@dataclass
class Column:
    name: str
    type: str  # format_type(), e.g. "timestamp with time zone"
    typname: str  # e.g. "timestamptz"; a domain's base type
    not_null: bool
    attnum: int
    scalar: bool
    ordered: bool = False  # the type has a default btree operator class


@dataclass
class ForeignKey:
    constraint: str
    table: str  # "schema.table" of the referencing table
    columns: list[str]
    on_delete: str
    acknowledged: bool = False
    deferred: bool = False  # DEFERRABLE INITIALLY DEFERRED: PostgreSQL checks it at COMMIT

    @property
    def blocks_deletion(self) -> bool:
        return self.on_delete in ("no action", "restrict")


@dataclass
class Validation:
    """What introspection found. ``warnings`` are human sentences, in a stable order."""

    table: str
    oid: int
    columns: dict[str, Column]
    supporting_index: str | None
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    estimated_rows: int | None = None

    def to_json(self) -> dict:
        used = {name: col.type for name, col in self.columns.items()}
        return {
            "table": self.table,
            "column_types": used,
            "supporting_index": self.supporting_index,
            "foreign_keys": [asdict(fk) for fk in self.foreign_keys],
            "warnings": list(self.warnings),
            "estimated_rows": self.estimated_rows,
        }


def _fetch(query: str, params: list) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def table_oid(schema: str, table: str) -> int:
    """The table's oid; SpecError naming it when there is no such (partitioned) table.

    Only a table this database login may read can be a policy's (the deployment grants
    ``SELECT`` on each target, ``retention grants apply --target``): any other is answered
    exactly as one that does not exist, so validating a policy file tells nobody whether a
    table they may not read exists, nor its columns and types."""
    rows = _fetch(
        "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s"
        " AND pg_catalog.has_table_privilege(c.oid, 'SELECT')",
        [schema, table],
    )
    if not rows:
        # near names only among the tables this login may read, as above
        near = _fetch(
            "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname = %s"
            " AND pg_catalog.has_table_privilege(c.oid, 'SELECT')",
            [schema],
        )
        raise SpecError(
            f"table {schema}.{table} does not exist (or this login may not read it)"
            f"{did_you_mean(f'{schema}.{table}', [r[0] for r in near])}",
            field="table",
        )
    oid, relkind = rows[0]
    if relkind not in ("r", "p"):
        raise SpecError(f"{schema}.{table} is not a table (relkind {relkind!r})")
    return int(oid)


# PostgreSQL's own schemas: never a target, whoever owns the connection.
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


def refuse_product_table(oid: int, where: str) -> None:
    """SpecError when ``oid`` is one of the product's own tables or a system catalog:
    a policy must never delete legal holds, audit rows, users or queued tasks. Every table
    in the product's own schema is the product's; an application's tables elsewhere —
    its own ``django_session`` or ``auth_user`` included — are targets like any other."""
    schema = settings.DB_SCHEMA
    rows = _fetch(
        "SELECT n.nspname = ANY(%s) OR (n.nspname = %s AND (%s <> 'public' OR c.relname = ANY(%s)))"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = %s",
        [list(SYSTEM_SCHEMAS), schema, schema, product_table_names(), oid],
    )
    if rows and rows[0][0]:
        raise SpecError(
            f"{where} belongs to Retention Runner (schema {schema}), Django's tables of the "
            "product or PostgreSQL itself; policies may only target application tables"
        )


def table_columns(oid: int) -> dict[str, Column]:
    rows = _fetch(
        # a domain is judged by its base type (a key of a domain over bigint is an integer
        # key); an enum is ordered by the btree operator class of all enums
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), b.typname,"
        " a.attnotnull, a.attnum, t.typtype, t.typcategory,"
        " EXISTS (SELECT 1 FROM pg_catalog.pg_opclass o JOIN pg_catalog.pg_am m ON m.oid = o.opcmethod"
        "  WHERE m.amname = 'btree' AND o.opcdefault AND (o.opcintype = b.oid"
        "  OR (b.typtype = 'e' AND o.opcintype = 'pg_catalog.anyenum'::pg_catalog.regtype)"
        # varchar (cidr, ...): the class of the type it coerces to binary, as an index has
        "  OR EXISTS (SELECT 1 FROM pg_catalog.pg_cast k WHERE k.castsource = b.oid"
        "   AND k.casttarget = o.opcintype AND k.castmethod = 'b' AND k.castcontext = 'i')))"
        " FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
        " JOIN pg_catalog.pg_type b"
        "  ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    )
    columns = {}
    for name, type_text, typname, not_null, attnum, typtype, category, ordered in rows:
        # base, domain, enum or range types compare as one value; arrays, composites,
        # pseudo-types and JSON documents do not make a tenant or a keep-rule operand.
        # User-defined base types (uuid, extension types) count when they are ordered
        # (a default btree operator class), as the planner's walk over tenants needs.
        scalar = typtype in ("b", "d", "e", "r") and category not in ("A", "P", "X")
        scalar = scalar and (category != "U" or ordered)
        scalar = scalar and typname not in ("json", "jsonb", "xml")
        columns[name] = Column(name, type_text, typname, not_null, attnum, scalar, bool(ordered))
    return columns


def _column(columns: dict[str, Column], name: str, where: str, table: str) -> Column:
    col = columns.get(name)
    if col is None:
        raise SpecError(
            f"{where} column {name!r} does not exist in table {table}{did_you_mean(name, columns)}",
            field=where if where in ("key", "timestamp", "tenant") else "",
        )
    return col


def _indexes(oid: int) -> list[tuple[str, list[int]]]:
    """Valid, non-partial btree indexes on plain columns: (name, [attnum, ...])."""
    rows = _fetch(
        "SELECT ic.relname, i.indkey::int2[] FROM pg_catalog.pg_index i"
        " JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid"
        " JOIN pg_catalog.pg_am am ON am.oid = ic.relam"
        " WHERE i.indrelid = %s AND am.amname = 'btree' AND i.indisvalid"
        " AND i.indpred IS NULL ORDER BY ic.relname",
        [oid],
    )
    return [(name, list(keys)) for name, keys in rows]


def _foreign_keys(oid: int) -> list[ForeignKey]:
    rows = _fetch(
        "SELECT con.conname, n.nspname, c.relname, con.confdeltype,"
        " ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)"
        "       JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum"
        "       ORDER BY k.ord)::text[], con.condeferred"
        " FROM pg_catalog.pg_constraint con"
        " JOIN pg_catalog.pg_class c ON c.oid = con.conrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.confrelid = %s AND con.conparentid = 0"
        " ORDER BY n.nspname, c.relname, con.conname",
        [oid],
    )
    return [
        ForeignKey(
            conname,
            f"{schema}.{rel}",
            list(cols),
            ON_DELETE.get(action, action),
            deferred=bool(deferred),
        )  # fmt: skip
        for conname, schema, rel, action, cols, deferred in rows
    ]


def _unindexed(edge: cascades.Edge) -> bool:
    """No valid, non-partial btree index on the referencing table leads with the foreign key's
    columns (in any order): each check of a deleted row's referencing rows scans the table."""
    attnums = {c.name: c.attnum for c in table_columns(edge.child).values()}
    wanted = {attnums.get(c) for c in edge.columns}
    return not any(set(keys[: len(wanted)]) == wanted for _name, keys in _indexes(edge.child))


def _published_without_identity(oid: int) -> list[tuple[str, str]]:
    """(table, publication): the table or one of its partitions is published with its
    deletes and some relation a DELETE would change has no replica identity."""
    return _fetch(
        "WITH tree AS (SELECT relid FROM pg_catalog.pg_partition_tree(%s::oid)"
        "  UNION SELECT %s::oid),"
        " pub AS (SELECT pt.pubname FROM pg_catalog.pg_publication_tables pt"
        "  JOIN pg_catalog.pg_publication pb ON pb.pubname = pt.pubname WHERE pb.pubdelete"
        "  AND to_regclass(quote_ident(pt.schemaname) || '.' || quote_ident(pt.tablename))"
        "   IN (SELECT relid FROM tree) ORDER BY 1 LIMIT 1)"
        " SELECT c.oid::regclass::text, pub.pubname FROM pub, tree"
        " JOIN pg_catalog.pg_class c ON c.oid = tree.relid"
        " WHERE c.relkind = 'r' AND (c.relreplident = 'n' OR (c.relreplident = 'd'"
        "  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
        "   WHERE i.indrelid = c.oid AND i.indisprimary))"
        "  OR (c.relreplident = 'i' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
        "   WHERE i.indrelid = c.oid AND i.indisreplident)))"
        " ORDER BY 1 LIMIT 1",
        [oid, oid],
    )


def _estimated_rows(oid: int) -> int | None:
    rows = _fetch("SELECT reltuples::bigint FROM pg_catalog.pg_class WHERE oid = %s", [oid])
    value = rows[0][0] if rows else None
    return int(value) if value is not None and value >= 0 else None


def _probe_keep_rules(spec: PolicySpec) -> None:
    """Run each keep rule's own SQL against the table with ``LIMIT 0``: a value that cannot
    be cast to the column type, or an operator the type lacks, fails here and not mid-run."""
    for index, rule in enumerate(spec.keep):
        cond = predicate.keep_condition(rule)
        query = sql.SQL("SELECT 1 FROM {} WHERE {} LIMIT 0").format(predicate.table(spec), cond.sql)
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(query, cond.params)
        except DatabaseError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(
                f"keep[{index}]: value of {rule.describe()} does not fit column "
                f"{rule.column!r} ({reason})"
            ) from None


def _probe_classes(spec: PolicySpec) -> None:
    """Each class's condition against the table with ``LIMIT 0``, as ``_probe_keep_rules``."""
    for index, entry in enumerate(spec.classes):
        cond = predicate.class_match(spec, entry.value)
        query = sql.SQL("SELECT 1 FROM {} WHERE {} LIMIT 0").format(predicate.table(spec), cond.sql)
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(query, cond.params)
        except DatabaseError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(
                f"class[{index}]: value of {entry.describe()} does not fit column "
                f"{entry.column!r} ({reason})"
            ) from None


def _check_overrides(spec: PolicySpec) -> None:
    """Every overridden tenant is a value of the tenant column (its type's input function
    decides), and no two name one tenant as the column's ``=`` compares (citext's ``Acme`` and
    ``acme``, an integer's ``7`` and ``07``): one statement over all of them."""
    if not spec.overrides:
        return
    ctype = predicate.column_types(spec).get(spec.tenant_columns[0])
    if ctype is None:
        return
    values = [v for o in spec.overrides for v in o.tenants]
    query = sql.SQL(
        "SELECT v, n FROM (SELECT min(v) AS v, count(*) AS n FROM unnest(%s::pg_catalog.text[])"
        " AS v GROUP BY (v::{}){}) AS s WHERE n > 1 LIMIT 1"
    ).format(ctype.cast(), ctype.collate())
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(query, [values])
            twice = cur.fetchone()
    except DatabaseError as exc:
        first = None
        for value in values:  # name the value that does not cast
            try:
                with transaction.atomic(), connection.cursor() as cur:
                    cur.execute(sql.SQL("SELECT %s::{}").format(ctype.cast()), [value])
            except DatabaseError:
                first = value
                break
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(
            f"override: tenant {first!r} is not a value of tenant column {spec.tenant!r} "
            f"({ctype.display}) of {spec.qualified_table}: {reason}"
        ) from None
    if twice is not None:
        raise SpecError(
            f"override: {twice[1]} tenant values equal {twice[0]!r} in tenant column "
            f"{spec.tenant!r} ({ctype.display}); each tenant takes one override"
        )


def _check_timestamp(spec: PolicySpec, ts: Column, where: str) -> None:
    """The timestamp column's type fits the policy: a ``timestamptz``, ``timestamp`` or
    ``date`` column, or a ``bigint``/``integer``/``numeric`` one with ``timestamp_unit`` (an
    epoch timestamp); each refusal names the way forward."""
    name = spec.timestamp
    if spec.timestamp_unit:
        if ts.typname not in EPOCH_TYPES:
            raise SpecError(
                f"timestamp_unit applies to a bigint, integer, numeric, double precision or real "
                f"timestamp column; "
                f"{name!r} of {where} is {ts.type}: leave timestamp_unit out"
            )
        if spec.timestamp_unit not in EPOCH_UNITS_OF[ts.typname]:
            raise SpecError(
                f"timestamp column {name!r} of {where} is {ts.type}, which cannot hold a "
                f'present-day time in timestamp_unit = "{spec.timestamp_unit}" (it overflows '
                f'within weeks of 1970); an integer column holds seconds ("s")'
            )
        if spec.timestamp_zone:
            raise SpecError(
                f"timestamp_zone applies to timestamp without time zone and date columns; "
                f"{name!r} of {where} counts from the Unix epoch, an instant in UTC"
            )
        return
    if ts.typname in (*EPOCH_TYPES, "int2"):
        raise SpecError(
            f"timestamp column {name!r} of {where} is {ts.type}, not a timestamp: if it holds "
            f'time since the Unix epoch, say so with timestamp_unit = "s", "ms" or "us" '
            f"(seconds, milliseconds, microseconds)"
        )
    if ts.typname not in TIMESTAMP_TYPES:
        raise SpecError(
            f"timestamp column {name!r} of {where} must be timestamptz, timestamp "
            f"or date, not {ts.type} (or bigint, integer, numeric, double precision or real "
            f"with timestamp_unit)"
        )
    if spec.timestamp_zone and ts.typname == "timestamptz":
        raise SpecError(
            f"timestamp_zone applies to timestamp without time zone and date columns; "
            f"{name!r} of {where} is a timestamp with time zone, whose values "
            f"are instants already"
        )


def _supporting_index(spec, result: Validation, columns, keys, ts, integer: bool) -> None:
    """The index a run's chunks are planned and deleted along, by the policy's ``chunking``:
    ``timestamp`` — one leading with the timestamp (refused without); ``tenant`` — one leading
    with (tenant…, key…); ``key`` — one leading with the key; ``auto`` — either of the last two
    (without a (tenant…, key…) index a run takes key-range chunks, on the key's index; with
    ``null_tenant = "delete"`` always those). Without one, an integer key still plans (a
    warning: every chunk scans the table); any other key is refused, naming every way out."""
    where = spec.qualified_table
    oid = result.oid
    found = _indexes(oid)
    key_nums = [k.attnum for k in keys]
    if spec.chunking == "timestamp":
        # chunks in timestamp order are planned and deleted along an index leading with it
        # (with the key after it, when there is one on exactly those columns)
        chunk_nums = list(dict.fromkeys([ts.attnum, *key_nums]))
        best = [n for n, cols in found if cols[: len(chunk_nums)] == chunk_nums]
        best = best or [n for n, cols in found if cols[:1] == [ts.attnum]]
        if not best:
            raise SpecError(
                f'chunking = "timestamp" needs a valid, non-partial btree index on {where} '
                f"leading with {spec.timestamp!r}: chunks in timestamp order are planned and "
                f"deleted along it; create one first"
            )
        result.supporting_index = best[0]
        return
    tenant_nums = [columns[t].attnum for t in spec.tenant_columns]
    per_tenant = tenant_nums and not set(tenant_nums) <= set(key_nums)
    # a composite key that holds the tenant columns orders by them already
    tenant_key = list(dict.fromkeys([*tenant_nums, *key_nums])) if per_tenant else key_nums
    if spec.chunking == "tenant":
        wanted = [tenant_key]
    elif spec.chunking == "key" or spec.null_tenant == "delete":
        wanted = [key_nums]
    else:
        wanted = [tenant_key, key_nums] if per_tenant else [key_nums]
    for lead in wanted:
        for name, index_keys in found:
            if index_keys[: len(lead)] == lead:
                result.supporting_index = name
                return
    names = {c.attnum: c.name for c in columns.values()}

    def label(nums) -> str:
        return f"({', '.join(names[n] for n in nums)})"

    cols = " or ".join(label(nums) for nums in wanted)
    if integer:  # an integer key still plans (slowly); any other key has no order to plan in
        result.warnings.append(
            f"no btree index on {where} {cols}: every chunk would scan the whole table; "
            f"create one before the first run"
        )
        return
    by_time = [n for n, index_keys in found if index_keys[:1] == [ts.attnum]]
    timestamp_way = (
        f'or set chunking = "timestamp" (chunks in timestamp order along {by_time[0]})'
        if by_time
        else f'or create one leading with {spec.timestamp!r} and set chunking = "timestamp"'
    )
    raise SpecError(
        f"no btree index on {where} {cols}: a key of type "
        f"{', '.join(k.type for k in keys)} is planned and deleted along such an index; "
        f"create one first, {timestamp_way}"
    )


def archive_destination_problem(directory: str) -> str | None:
    """Why the archive directory cannot take files, or None: it must exist, be a directory and
    take a file written, synced and removed (a read-only or full file system fails here)."""
    if not os.path.isdir(directory):
        return f"archive.to: {directory} is not an existing directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".retention-probe-", dir=directory)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"archive.to: {directory} is not writable ({exc.strerror or exc})"
    return None


def _check_archive(spec: PolicySpec, where: str, graph, tree) -> None:
    """An archiving policy: a writable directory, or a table in a registered database that
    fits the table's rows (``archive_tables``); no cascade (its child rows would go without
    a copy); no partition dropped whole (its rows would go without a copy)."""
    if spec.archive_dir:
        problem = archive_destination_problem(spec.archive_dir)
        if problem:
            raise SpecError(problem)
    else:
        archive_tables.check_destination(spec)
    reached = sorted({e.child_name for edges in graph.edges.values() for e in edges})
    if reached:
        raise SpecError(
            f"[archive] cannot go with ON DELETE CASCADE: deleting from {where} deletes rows of "
            f"{', '.join(reached)}, which would go without a copy; archive those tables with "
            f"policies of their own first, or remove [archive]"
        )
    if tree is not None and tree.on:
        raise SpecError(
            f"[archive] cannot go with a range-partitioned table: {where}'s partitions past the "
            f"cutoff are dropped whole, without a copy; remove [archive] or archive a "
            f"table that is not partitioned"
        )


def _check_acknowledged(graph, acknowledged: set[str], where: str) -> None:
    """Every table a DELETE here reaches by cascades is listed in ``cascade_ack``: SpecError
    naming every one that is not, at once."""
    missing: dict[str, list[str]] = {}
    for edges in graph.edges.values():
        for edge in edges:
            if edge.child_name not in acknowledged:
                how = (
                    f"{edge.child_name} ({', '.join(edge.columns)}) references {where} with ON "
                    f"DELETE CASCADE"
                    if edge.parent == graph.root
                    else f"foreign key {edge} cascades from {graph.names[edge.parent]}"
                )
                missing.setdefault(edge.child_name, []).append(how)
    if not missing:
        return
    tables = sorted(missing)
    how = "; ".join(h for t in tables for h in missing[t])
    raise SpecError(
        f"deleting from {where} deletes rows of {len(tables)} table(s) not listed in "
        f"cascade_ack: {how}; list {', '.join(repr(t) for t in tables)} in cascade_ack to "
        f"accept it"
    )


def row_security(oids) -> list[tuple[str, bool, bool]]:
    """The tables among ``oids`` with row-level security enabled: (schema.table, forced, this
    login sees every row — a superuser, a role with BYPASSRLS, or the owner when not forced)."""
    return _fetch(
        "SELECT n.nspname || '.' || c.relname, c.relforcerowsecurity,"
        " r.rolsuper OR r.rolbypassrls"
        "  OR (NOT c.relforcerowsecurity AND pg_catalog.pg_has_role(c.relowner, 'USAGE'))"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_catalog.pg_roles r ON r.rolname = current_user"
        " WHERE c.oid = ANY(%s::oid[]) AND c.relrowsecurity ORDER BY 1",
        [list(oids)],
    )


def hidden_tables(graph) -> list[str]:
    """One line per table of ``graph`` (the target and the tables its cascades reach) whose
    row-level security hides rows from this login: a run as it would delete and verify only
    what it is allowed to see."""
    return [
        f"{name} has row-level security{' (FORCE)' if forced else ''} and login "
        f"{_current_user()} does not bypass it: it would see, delete and verify only the rows "
        f"its policies allow; give the worker login BYPASSRLS (retention grants apply --worker "
        f"… --target {name})"
        for name, forced, sees in row_security(graph.names)
        if not sees
    ]


def _current_user() -> str:
    return _fetch("SELECT current_user", [])[0][0]


def row_security_warnings(graph) -> list[str]:
    return [
        f"{name} has row-level security{' (FORCE)' if forced else ''}: the worker login must "
        f"bypass it (retention grants apply --worker … --target {name} grants BYPASSRLS); a "
        f"run whose login does not is refused before it deletes"
        for name, forced, _sees in row_security(graph.names)
    ]


def before_delete_triggers(oids) -> list[tuple[str, str]]:
    """(schema.table, trigger) of the enabled row-level BEFORE DELETE triggers on ``oids``
    (a trigger returning NULL skips the row's deletion)."""
    return _fetch(
        "SELECT n.nspname || '.' || c.relname, t.tgname FROM pg_catalog.pg_trigger t"
        " JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE t.tgrelid = ANY(%s::oid[]) AND NOT t.tgisinternal AND t.tgenabled <> 'D'"
        " AND (t.tgtype & 1) = 1 AND (t.tgtype & 2) = 2 AND (t.tgtype & 8) = 8 ORDER BY 1, 2",
        [list(oids)],
    )


def has_before_delete_trigger(schema: str, table: str) -> bool:
    """Whether ``schema.table`` has an enabled row-level BEFORE DELETE trigger; False when there
    is no such table (the statement on it then fails with its own SQLSTATE)."""
    return bool(
        _fetch(
            "SELECT 1 FROM pg_catalog.pg_trigger t"
            " JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND NOT t.tgisinternal"
            " AND t.tgenabled <> 'D' AND (t.tgtype & 1) = 1 AND (t.tgtype & 2) = 2"
            " AND (t.tgtype & 8) = 8 LIMIT 1",
            [schema, table],
        )
    )


def trigger_warnings(graph) -> list[str]:
    return [
        f"trigger {trigger} on {name} runs BEFORE DELETE: a row it skips (RETURN NULL) stays; "
        f"verification finds it still eligible and the run is not called drained while it "
        f"remains"
        for name, trigger in before_delete_triggers(graph.names)
    ]


def validate(spec: PolicySpec) -> Validation:
    """Check ``spec`` against the database; raise SpecError on the first blocking problem.

    Blocking: chunk timeouts that cannot fit django-q2's task timeout, one of the product's own tables, missing table or column, incompatible key/timestamp/tenant/keep column type,
    a keep value the column cannot compare with, a cascading foreign key not listed in
    ``cascade_ack``. Warnings: no supporting index, restrict/no-action references (chunks
    will fail while referencing rows exist), set-null/set-default references, a nullable
    key column, ``cascade_ack`` entries that match no foreign key.
    """
    too_long = timeouts.chunk_timeouts_error(spec.lock_timeout_ms, spec.statement_timeout_ms)
    if too_long:
        raise SpecError(too_long)
    where = spec.qualified_table
    oid = table_oid(spec.schema, spec.table)
    refuse_product_table(oid, where)
    columns = table_columns(oid)
    keys = [_column(columns, name, "key", where) for name in spec.key_columns]
    for key in keys:
        if not key.ordered or key.typname in ("json", "xml"):
            raise SpecError(
                f"key column {key.name!r} of {where} has no btree ordering ({key.type}): "
                f"chunks are key intervals, so the key must be a type a btree index can order"
            )
    integer = len(keys) == 1 and keys[0].typname in KEY_TYPES
    ts = _column(columns, spec.timestamp, "timestamp", where)
    _check_timestamp(spec, ts, where)
    used = {**{k.name: k for k in keys}, spec.timestamp: ts}
    tenants = [_column(columns, name, "tenant", where) for name in spec.tenant_columns]
    for tenant in tenants:
        if not tenant.scalar:
            raise SpecError(
                f"tenant column {tenant.name!r} of {where} must hold a single value, "
                f"not {tenant.type}"
            )
        used[tenant.name] = tenant
    try:  # every active hold that applies fits the version's tenant and key
        holds.check_version(spec)
    except holds.TenantMismatch as exc:
        raise SpecError(str(exc)) from None
    for index, rule in enumerate(spec.keep):
        col = _column(columns, rule.column, f"keep[{index}]", where)
        if not col.scalar and rule.op not in ("is null", "is not null"):
            raise SpecError(f"keep[{index}]: column {rule.column!r} of {where} is a {col.type}")
        used[rule.column] = col
    _probe_keep_rules(spec)
    for index, entry in enumerate(spec.classes):
        col = _column(columns, entry.column, f"class[{index}]", where)
        if not col.scalar:
            raise SpecError(f"class[{index}]: column {entry.column!r} of {where} is a {col.type}")
        used[entry.column] = col
    _probe_classes(spec)
    _check_overrides(spec)

    result = Validation(where, oid, used, None, estimated_rows=_estimated_rows(oid))
    _supporting_index(spec, result, columns, keys, ts, integer)
    named = [("key", k) for k in spec.key_columns]
    named += [("timestamp", spec.timestamp)]
    if spec.null_tenant != "delete":  # a NULL tenant is eligible with "delete"
        named += [("tenant", t) for t in spec.tenant_columns]
    seen: set[str] = set()
    for what, name in named:
        if not name or name in seen:
            continue
        seen.add(name)
        if not columns[name].not_null:
            result.warnings.append(
                f"{what} column {name!r} is nullable: rows with a NULL {what} are never "
                f"deleted (runs and the preview report them as not eligible: NULL)"
            )

    acknowledged = set(spec.cascade_ack)
    graph = cascades.graph_of(spec)  # SpecError: a cascade that cannot be followed
    _check_acknowledged(graph, acknowledged, where)
    for fk in _foreign_keys(oid):
        result.foreign_keys.append(fk)
        ref = f"{fk.table} ({', '.join(fk.columns)})"
        if fk.on_delete == "cascade":
            fk.acknowledged = True
            result.warnings.append(
                f"{ref} cascades: its rows referencing deleted rows are deleted too (acknowledged)"
                f"; a row is deleted only when no row its cascade reaches is protected by a "
                f"policy of that table (its cutoff, keep rules, legal holds)"
            )
        elif fk.blocks_deletion:
            result.warnings.append(
                f"{ref} references {where} with ON DELETE {fk.on_delete.upper()}: "
                f"chunks fail while referencing rows exist"
            )
            if fk.deferred:
                result.warnings.append(
                    f"foreign key {fk.constraint} on {ref} is DEFERRABLE INITIALLY DEFERRED: "
                    f"PostgreSQL would report its violations only at COMMIT; each chunk's "
                    f"DELETE leaves the rows it references in place instead (kept: referenced "
                    f"by a row that stays), and checks it at its end (SET CONSTRAINTS ALL "
                    f"IMMEDIATE) for a reference made meanwhile"
                )
        else:
            result.warnings.append(
                f"{ref} references {where} with ON DELETE {fk.on_delete.upper()}: "
                f"deleting updates those rows"
            )
    for edges in graph.edges.values():
        for edge in edges:
            if _unindexed(edge):
                result.warnings.append(
                    f"foreign key {edge} has no index leading with its columns: every row a "
                    f"chunk deletes scans {edge.child_name} for the rows its cascade reaches; "
                    f"create one on {edge.child_name} ({', '.join(edge.columns)})"
                )
    for child in graph.names:
        if child == oid:
            continue
        for fk in _foreign_keys(child):
            if fk.on_delete in ("set null", "set default"):
                result.warnings.append(
                    f"{fk.table} ({', '.join(fk.columns)}) references "
                    f"{graph.names[child]}, which deleting here cascades to, with ON DELETE "
                    f"{fk.on_delete.upper()}: deleting here updates those rows"
                )
    result.warnings.extend(row_security_warnings(graph))
    result.warnings.extend(trigger_warnings(graph))
    unidentified = _published_without_identity(oid)
    if unidentified:
        raise SpecError(
            f"{where} is in publication {unidentified[0][1]}, which publishes deletes, but "
            f"{unidentified[0][0]} has no replica identity (no primary key, no REPLICA "
            f"IDENTITY index or FULL): PostgreSQL refuses every DELETE on it; add a primary "
            f"key or set its replica identity first"
        )
    tree = partitions.read_tree(spec)  # SpecError: sub-partitioned, or pg_partman's
    if tree is not None and tree.on:
        result.warnings.append(
            f"{where} is range-partitioned by {tree.partkey} ({len(tree.partitions)} "
            f"partitions): a partition wholly past the cutoff with nothing kept or held is "
            f"detached and {'dropped' if spec.partition_action == 'drop' else 'left detached'}"
            f"; the others{' and the default partition' if tree.has_default else ''} are "
            f"deleted in chunks"
        )
    elif tree is not None:
        result.warnings.append(
            f"{where} is partitioned by {tree.partkey}, but {tree.why}: no partition is "
            f"dropped whole, every row is deleted in chunks"
        )
    elif spec.partition_action != "drop":
        result.warnings.append(
            f"partition_action = {spec.partition_action!r} has no effect: {where} is not partitioned"
        )
    if spec.archive_to:
        _check_archive(spec, where, graph, tree)
    reached = {fk.table for fk in result.foreign_keys if fk.acknowledged}
    reached |= {e.child_name for edges in graph.edges.values() for e in edges}
    stray = sorted(acknowledged - reached)
    if stray:
        result.warnings.append(
            f"cascade_ack lists {', '.join(stray)}, which has no cascading reference to {where}"
        )
    return result
