"""A policy's partition tree, read from the catalog: which partitions a run may drop whole.

Only declarative range partitioning on one plain column — the policy's timestamp or its key —
lets a partition go whole; everything else (and the default partition) is deleted in chunks.
Sub-partitioned trees and tables pg_partman manages are refused (``SpecError``). Every name
comes from the catalog and is composed with ``psycopg.sql``; values are bound.
See docs/engine.md, "Partitions".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import connection
from psycopg import sql

from retention import predicate as P
from retention.spec import PolicySpec, SpecError

_RANGE = re.compile(r"^FOR VALUES FROM \((.+)\) TO \((.+)\)$", re.S)


@dataclass(frozen=True)
class Partition:
    schema: str
    name: str
    bound: str  # pg_get_expr(relpartbound): "FOR VALUES FROM (...) TO (...)" or "DEFAULT"
    lower: str | None  # the bound's value as text; None: MINVALUE (or the default partition)
    upper: str | None  # None: MAXVALUE (or the default partition)
    estimated_rows: int | None

    @property
    def is_default(self) -> bool:
        return self.bound == "DEFAULT"

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


@dataclass
class Tree:
    """``on``: "timestamp" or "key" when partitions may be dropped whole, else "" (``why``)."""

    partkey: str  # pg_get_partkeydef
    on: str
    why: str = ""
    partitions: list[Partition] = field(default_factory=list)

    @property
    def has_default(self) -> bool:
        return any(p.is_default for p in self.partitions)


def _fetch(query, params) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(
            query.as_string(cur.connection) if not isinstance(query, str) else query, params
        )
        return cur.fetchall()


def _literal(text: str) -> str | None:
    """One bound value as pg_get_expr writes it: a quoted literal, a number, MINVALUE/MAXVALUE."""
    text = text.strip()
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    return text


def pg_partman_config(schema: str, table: str) -> str | None:
    """The qualified name of pg_partman's ``part_config`` when it lists ``schema.table``."""
    rows = _fetch(
        "SELECT n.nspname FROM pg_catalog.pg_extension e"
        " JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_partman'",
        [],
    )
    if not rows:
        return None
    nsp = rows[0][0]
    found = _fetch(
        sql.SQL("SELECT 1 FROM {} WHERE parent_table = %s").format(
            sql.Identifier(nsp, "part_config")
        ),
        [f"{schema}.{table}"],
    )
    return f"{nsp}.part_config" if found else None


def read_tree(spec: PolicySpec) -> Tree | None:
    """The partition tree of the policy's table; None when the table is not partitioned.
    SpecError for a tree the engine refuses (sub-partitions, pg_partman)."""
    rows = _fetch(
        "SELECT c.oid, pt.partstrat, pt.partnatts, pg_catalog.pg_get_partkeydef(c.oid),"
        " (SELECT a.attname FROM pg_catalog.pg_attribute a"
        "   WHERE a.attrelid = c.oid AND a.attnum = pt.partattrs[0])"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_catalog.pg_partitioned_table pt ON pt.partrelid = c.oid"
        " WHERE n.nspname = %s AND c.relname = %s",
        [spec.schema, spec.table],
    )
    if not rows:
        return None
    oid, strategy, natts, partkey, column = rows[0]
    where = spec.qualified_table
    config = pg_partman_config(spec.schema, spec.table)
    if config:
        raise SpecError(
            f"{where} is managed by pg_partman ({config} lists it): pg_partman's retention "
            f"(retention, retention_keep_table in {config}) owns dropping its partitions, and "
            f"two tools dropping the same partitions would fight; keep retention in pg_partman, "
            f"or remove the table from {config} to let this policy own it (with legal holds, "
            f"keep rules and audit evidence)"
        )
    parts = _fetch(
        "SELECT n.nspname, c.relname, c.relkind, pg_catalog.pg_get_expr(c.relpartbound, c.oid),"
        " c.reltuples::bigint, t.level"
        " FROM pg_catalog.pg_partition_tree(%s::oid) t"
        " JOIN pg_catalog.pg_class c ON c.oid = t.relid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE t.relid <> %s::oid ORDER BY t.level, c.relname",
        [oid, oid],
    )
    nested = [f"{s}.{n}" for s, n, kind, _b, _r, level in parts if kind == "p" or level > 1]
    if nested:
        raise SpecError(
            f"{where} is sub-partitioned ({', '.join(nested[:3])}): retention handles one level "
            f"of range partitions; target each sub-partitioned partition by its own policy"
        )
    on, why = "", ""
    if strategy != "r":
        why = "it is not range-partitioned"
    elif natts != 1 or column is None:
        why = f"it is partitioned by {partkey}, not one column"
    elif column == spec.timestamp:
        on = "timestamp"
    elif column == spec.key:
        on = "key"
    else:
        why = f"it is partitioned on {column!r}, neither the timestamp nor the key"
    if on and not P.integer_key(spec):
        # the ledger and the audit record name a partition's keys as a bigint interval
        on, why = "", "its key is not one integer column (partitions go whole only then)"
    tree = Tree(partkey, on, why)
    for schema, name, kind, bound, tuples, _level in parts:
        if kind == "f":
            raise SpecError(
                f"{where} has a foreign partition {schema}.{name}; it cannot be deleted from here"
            )
        lower = upper = None
        match = _RANGE.match(bound or "")
        if match and natts == 1:
            lower, upper = _literal(match.group(1)), _literal(match.group(2))
        tree.partitions.append(
            Partition(schema, name, bound, lower, upper, int(tuples) if tuples >= 0 else None)
        )
    tree.partitions.sort(key=lambda p: (p.is_default, p.lower is not None, _sort_key(p.lower)))
    return tree


def _sort_key(value: str | None):
    if value is None:
        return (0, "")
    try:
        return (0, f"{int(value):+021d}")
    except ValueError:
        return (1, value)


def shown_bounds(spec: PolicySpec, bound: str, on: str) -> str:
    """A partition's bounds as people read them: on an epoch timestamp column
    (``timestamp_unit``), the instants its numbers count to — ``FOR VALUES FROM (2026-01-01
    00:00:00+00:00) TO (2026-02-01 00:00:00+00:00)``; anything else as the catalog writes it."""
    match = _RANGE.match(bound or "")
    if on != "timestamp" or not spec.timestamp_unit or not match:
        return bound
    ends = [_literal(match.group(1)), _literal(match.group(2))]
    shown = [
        ("MINVALUE" if i == 0 else "MAXVALUE")
        if value is None
        else P.shown_value(spec, spec.timestamp, value)
        for i, value in enumerate(ends)
    ]
    return f"FOR VALUES FROM ({shown[0]}) TO ({shown[1]})"


def shown_bounds_of(spec: PolicySpec, bounds: list[str]) -> list[str]:
    """``shown_bounds`` for partitions of the policy's table as it is now (the catalog says
    what it is partitioned on); the bounds as they are when that cannot be read."""
    if not spec.timestamp_unit or not bounds:
        return bounds
    try:
        tree = read_tree(spec)
    except SpecError:
        return bounds
    on = tree.on if tree is not None else ""
    return [shown_bounds(spec, bound, on) for bound in bounds]


def spec_of(spec: PolicySpec, part: Partition) -> PolicySpec:
    """The policy's spec aimed at one partition (same columns, the partition's table)."""
    return replace(spec, schema=part.schema, table=part.name)


def bound_past(spec: PolicySpec, tree: Tree, part: Partition, cutoff: datetime) -> bool:
    """Whether every value the partition's bounds admit is past the cutoff (timestamp
    partitioning: the upper bound, in the column's own type, at or before the cutoff as
    ``predicate.older_than`` compares rows), or — key partitioning — the table already holds a
    key at or above the partition's upper bound (new keys go to later partitions)."""
    if part.is_default or part.upper is None or not tree.on:
        return False
    types = P.column_types(spec)
    if tree.on == "timestamp":
        ctype = types[spec.timestamp]
        query = sql.SQL("SELECT CAST(%s AS {}) <= %s").format(ctype.cast())
        return bool(_fetch(query, [part.upper, P.cutoff_value(spec, cutoff, types=types)])[0][0])
    ctype = types[spec.key]
    query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} >= CAST(%s AS {}))").format(
        P.table(spec), P.col(spec.key), ctype.cast()
    )
    return bool(_fetch(query, [part.upper])[0][0])


def blocker(spec: PolicySpec, part: Partition) -> str:
    """Why the partition may not go whole ('' when it may): a DELETE trigger or rule a drop
    would bypass (on it or on the policy's table), a publication that replicates its deletes
    (a drop reaches no subscriber), or an object that depends on it (a view, a
    foreign key referencing it, ...) that ``DROP TABLE`` would refuse. Such a partition is
    deleted in chunks."""
    rows = _fetch(
        "WITH p AS (SELECT to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) AS oid,"
        " to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) AS parent)"
        " SELECT format('DELETE trigger %%I on %%s', t.tgname, t.tgrelid::regclass)"
        " FROM pg_catalog.pg_trigger t, p WHERE t.tgrelid IN (p.oid, p.parent)"
        " AND NOT t.tgisinternal AND t.tgenabled <> 'D' AND (t.tgtype & 8) <> 0"
        " UNION ALL SELECT format('DELETE rule %%I on %%s', r.rulename, r.ev_class::regclass)"
        " FROM pg_catalog.pg_rewrite r, p WHERE r.ev_class IN (p.oid, p.parent)"
        " AND r.ev_type = '4'"
        " UNION ALL SELECT format('publication %%I (publishes deletes)', pt.pubname)"
        " FROM pg_catalog.pg_publication_tables pt"
        " JOIN pg_catalog.pg_publication pb ON pb.pubname = pt.pubname, p"
        " WHERE pb.pubdelete AND to_regclass(quote_ident(pt.schemaname) || '.'"
        "  || quote_ident(pt.tablename)) IN (p.oid, p.parent)"
        " UNION ALL SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)"
        " FROM pg_catalog.pg_depend d, p WHERE d.refclassid = 'pg_catalog.pg_class'::regclass"
        " AND d.refobjid = p.oid AND d.deptype = 'n'"
        # its own parts, and a foreign key on the parent's level (DETACH checks and moves it)
        " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c WHERE d.classid ="
        "  'pg_catalog.pg_constraint'::regclass AND c.oid = d.objid"
        "  AND (c.conrelid = p.oid OR c.conparentid <> 0))"
        " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite r WHERE d.classid ="
        "  'pg_catalog.pg_rewrite'::regclass AND r.oid = d.objid AND r.ev_class = p.oid)"
        " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE d.classid ="
        "  'pg_catalog.pg_trigger'::regclass AND t.oid = d.objid AND t.tgrelid = p.oid)"
        " LIMIT 3",
        [part.schema, part.name, spec.schema, spec.table],
    )
    if not rows:
        return ""
    return f"a drop would bypass or break {', '.join(r[0] for r in rows)}"


def census_query(spec: PolicySpec, part_spec: PolicySpec, *, policy_id: int, cutoff, outside=(),
                 digest: bool = False) -> P.Fragment:  # fmt: skip
    """One scan of a partition (``part_spec``): rows, rows not eligible under the full
    predicate (kept, held, NULL, not older, discarded), held rows, kept rows, min and max key,
    and (``digest``) md5 over its ordered keys."""
    ok = P.eligible(part_spec, policy_id=policy_id, cutoff=cutoff, outside=outside)
    held = P.held(part_spec, policy_id)
    kept = P.kept(part_spec)
    key = P.key_expr(spec)
    # min and max of an integer key (the partition's ledger chunk bounds); other keys have none
    ends = (
        sql.SQL("min({k}), max({k})").format(k=key)
        if P.integer_key(spec)
        else sql.SQL("NULL::bigint, NULL::bigint")
    )
    dig = (
        sql.SQL("md5(coalesce(string_agg({}::text, ',' ORDER BY {}), ''))").format(key, key)
        if digest
        else sql.SQL("NULL::text")
    )
    return P.Fragment(
        sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE ({ok}) IS NOT TRUE),"
            " count(*) FILTER (WHERE {held}), count(*) FILTER (WHERE {kept}),"
            " {ends}, {dig} FROM {tbl}"
        ).format(
            ok=ok.sql, held=held.sql, kept=kept.sql, ends=ends, dig=dig, tbl=P.table(part_spec)
        ),
        [*ok.params, *held.params, *kept.params],
    )


@dataclass
class Census:
    rows: int
    protected: int  # rows that may not go (kept, held, NULL, not older, discarded)
    held: int
    kept: int
    min_key: int | None
    max_key: int | None
    digest: str | None

    @property
    def droppable(self) -> bool:
        """Nothing in it may stay (an empty partition past the cutoff goes too: left attached,
        it would stay for ever once the chunks had emptied it)."""
        return self.protected == 0


def census(spec: PolicySpec, part: Partition, *, policy_id: int, cutoff, outside=(),
           digest: bool = False) -> Census:  # fmt: skip
    frag = census_query(spec, spec_of(spec, part), policy_id=policy_id, cutoff=cutoff,
                        outside=outside, digest=digest)  # fmt: skip
    return Census(*_fetch(frag.sql, frag.params)[0])


def plan(spec: PolicySpec, *, policy_id: int, cutoff, tree: Tree | None = None) -> list[dict]:
    """Per partition: bounds, rows, past the cutoff or not, kept and held rows, and the action
    a run starting now would take (the preview's table; the run decides again under the fence)."""
    tree = tree or read_tree(spec)
    if tree is None:
        return []
    out = []
    for part in tree.partitions:
        past = bound_past(spec, tree, part, cutoff)
        c = census(spec, part, policy_id=policy_id, cutoff=cutoff)
        if part.is_default:
            action = "chunks (default partition: never dropped)"
        elif not tree.on:
            action = f"chunks ({tree.why})"
        elif not past:
            action = "chunks (straddles the cutoff)" if c.rows - c.protected else "none (newer)"
        elif c.rows and blocker(spec, part):
            action = f"chunks ({blocker(spec, part)})"
        elif c.rows == 0:
            action = f"{spec.partition_action} (empty)"
        elif c.droppable:
            action = spec.partition_action
        else:
            action = f"chunks ({c.held} held, {c.kept} kept)"
        out.append(
            {
                "partition": part.qualified,
                "bounds": shown_bounds(spec, part.bound, tree.on),
                "estimated_rows": part.estimated_rows,
                "rows": c.rows,
                "past_cutoff": past,
                "eligible": c.rows - c.protected,
                "kept": c.kept,
                "held": c.held,
                "action": action,
            }
        )
    return out
