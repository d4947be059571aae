"""``ON DELETE CASCADE`` under a policy: which tables a chunk's DELETE reaches, and the guard
that keeps a cascade away from every row a legal hold, a keep rule or a cutoff protects.

The rule (docs/policies.md, "Cascades"):

- a row of a table that no approved policy targets is not protected: listing the table in
  ``cascade_ack`` accepts that its rows referencing a deleted row go with it (and they are
  counted in the chunk's audit record);
- a row of a table that an approved policy targets — another table, or the policy's own table
  (a posts table whose reposts reference their original) — is protected unless every such
  policy would delete it: older than that policy's cutoff (for the run's own policy, the run's
  cutoff; for another, ``cutoff_for`` the run's tick), no keep rule of it protects the row, no
  active legal hold applying to it covers the row, its key, timestamp and tenant not NULL;
- a row may go only when nothing its cascade reaches, at any depth, is protected: a parent
  whose cascade would reach a protected row is left in place by the chunk's DELETE (one
  ``NOT EXISTS`` per cascading foreign key, following its columns on the referencing table's
  index; a table that references itself is followed with a recursive query to every
  descendant).

Cascades through a cycle of two or more tables, or deeper than ``MAX_DEPTH`` tables, cannot be
followed here: validation refuses such a policy, naming the foreign key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from psycopg import sql

from retention import predicate as P
from retention.models import PolicyVersion
from retention.spec import PolicySpec, SpecError

MAX_DEPTH = 4  # tables in a chain of cascades below the target


@dataclass(frozen=True)
class Edge:
    """One cascading foreign key: rows of ``child`` whose ``columns`` equal a deleted
    ``parent`` row's ``referenced`` columns are deleted with it."""

    constraint: str
    parent: int  # oid
    child: int  # oid
    child_name: str  # "schema.table"
    columns: tuple[str, ...]
    referenced: tuple[str, ...]
    deferrable: bool = False

    @property
    def schema(self) -> str:
        return self.child_name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.child_name.split(".", 1)[1]

    def __str__(self) -> str:
        return f"{self.constraint} on {self.child_name} ({', '.join(self.columns)})"


@dataclass
class Graph:
    """The tables a DELETE on ``root`` reaches by cascades: ``names`` by oid (the root's
    first), ``edges`` by parent oid."""

    root: int
    names: dict[int, str] = field(default_factory=dict)
    edges: dict[int, list[Edge]] = field(default_factory=dict)

    @property
    def cascades(self) -> bool:
        return any(self.edges.values())


def _fetch(query: str, params: list) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def cascading_keys(oid: int) -> list[Edge]:
    """The ``ON DELETE CASCADE`` foreign keys that reference table ``oid`` (a partitioned
    table's own, not their copies on its partitions)."""
    rows = _fetch(
        "SELECT con.conname, con.conrelid, n.nspname || '.' || c.relname, con.condeferrable,"
        " ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[],"
        " ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[]"
        " FROM pg_catalog.pg_constraint con"
        " JOIN pg_catalog.pg_class c ON c.oid = con.conrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.confrelid = %s AND con.confdeltype = 'c'"
        " AND con.conparentid = 0 ORDER BY 3, 1",
        [oid],
    )
    return [
        Edge(name, oid, child, child_name, tuple(cols), tuple(refs), bool(deferrable))
        for name, child, child_name, deferrable, cols, refs in rows
    ]


def self_blocking_keys(spec: PolicySpec) -> list[Edge]:
    """The table's foreign keys to itself with ``ON DELETE NO ACTION`` or ``RESTRICT``
    (deferrable or not): a row referenced by another row of the table cannot go before it. A
    run on such a table deletes newest first and spares, in each chunk, the rows a row that
    stays references (``spare_referenced``)."""
    rows = _fetch(
        "SELECT con.conname, con.conrelid, n.nspname || '.' || c.relname, con.condeferrable,"
        " ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[],"
        " ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[]"
        " FROM pg_catalog.pg_constraint con"
        " JOIN pg_catalog.pg_class c ON c.oid = con.conrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.conparentid = 0 AND con.confdeltype IN ('a', 'r')"
        " AND con.conrelid = con.confrelid"
        " AND con.conrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))"
        " ORDER BY 1",
        [spec.schema, spec.table],
    )
    return [
        Edge(name, oid, oid, child_name, tuple(cols), tuple(refs), bool(deferrable))
        for name, oid, child_name, deferrable, cols, refs in rows
    ]


def deferred_references(spec: PolicySpec) -> list[Edge]:
    """The foreign keys of other tables to this one that are ``DEFERRABLE`` with ``ON DELETE
    NO ACTION`` (as Django creates every foreign key): a chunk's DELETE leaves the rows they
    reference in place (``kept_referenced``) instead of failing on them at its end and being
    split down to single rows."""
    rows = _fetch(
        "SELECT con.conname, con.conrelid, n.nspname || '.' || c.relname,"
        " ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[],"
        " ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum"
        "  ORDER BY k.ord)::text[], con.confrelid"
        " FROM pg_catalog.pg_constraint con"
        " JOIN pg_catalog.pg_class c ON c.oid = con.conrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.conparentid = 0 AND con.confdeltype = 'a'"
        " AND con.condeferrable AND con.conrelid <> con.confrelid"
        " AND con.confrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))"
        " ORDER BY 3, 1",
        [spec.schema, spec.table],
    )
    return [
        Edge(name, parent, child, child_name, tuple(cols), tuple(refs), True)
        for name, child, child_name, cols, refs, parent in rows
    ]


def kept_referenced(edges: list[Edge]) -> P.Fragment:
    """A condition on the row ``t``: no row of another table references it through ``edges``
    (``deferred_references``) — one probe of each key's referencing columns."""
    return P.Fragment(
        sql.SQL(" AND ").join(
            sql.SQL("NOT EXISTS (SELECT 1 FROM {} AS r WHERE {})").format(
                sql.Identifier(e.schema, e.table), _match(e, "r", "t")
            )
            for e in edges
        ),
        [],
    )


def spare_referenced(spec: PolicySpec, edges: list[Edge], chunk) -> P.Fragment:
    """A condition on the chunk's row ``t``: no row that stays references it through the
    table's own ``edges`` (``self_blocking_keys``), directly or through rows it keeps that
    way. ``chunk(alias)``: the chunk's rows (``predicate.chunk_rows``) read as ``alias``. The
    rows spared are found once, by one recursive query the DELETE reads as a hashed set: the
    chunk's rows referenced by a row outside them, then the chunk's rows those reference, …"""
    target = sql.Identifier(spec.schema, spec.table)
    rows = chunk("s")
    step_t = chunk("n")
    carried = list(dict.fromkeys(c for e in edges for c in e.referenced))
    names = [f"k{i}" for i in range(len(carried))]

    def referencing(e: Edge) -> sql.Composable:
        # a row of the table outside the chunk's rows references the chunk's row ``c``
        match = sql.SQL(" AND ").join(
            sql.SQL("r.{} = c.{}").format(
                sql.Identifier(x), sql.Identifier(names[carried.index(y)])
            )
            for x, y in zip(e.columns, e.referenced, strict=True)
        )
        return sql.SQL(
            "EXISTS (SELECT 1 FROM {t} AS r WHERE {m} AND r.ctid NOT IN (SELECT tid FROM c))"
        ).format(t=target, m=match)

    step = sql.SQL(" OR ").join(sql.SQL("({})").format(_match(e, "b", "n")) for e in edges)
    text = sql.SQL(
        "t.ctid NOT IN (WITH RECURSIVE c AS MATERIALIZED (SELECT s.ctid AS tid, {carry}"
        " FROM {t} AS s WHERE {rows}),"
        " spared(tid) AS (SELECT c.tid FROM c WHERE {outside}"
        " UNION SELECT n.ctid FROM spared JOIN {t} AS b ON b.ctid = spared.tid"
        " JOIN {t} AS n ON {step} WHERE {nc}) SELECT tid FROM spared)"
    ).format(
        carry=sql.SQL(", ").join(
            sql.SQL("s.{} AS {}").format(sql.Identifier(x), sql.Identifier(n))
            for x, n in zip(carried, names, strict=True)
        ),
        t=target, rows=rows.sql,
        outside=sql.SQL(" OR ").join(referencing(e) for e in edges),
        step=step, nc=step_t.sql,
    )  # fmt: skip
    return P.Fragment(text, [*rows.params, *step_t.params])


def _primary_key(oid: int) -> list[str]:
    """The primary key's columns of table ``oid``, in order (empty: none)."""
    rows = _fetch(
        "SELECT a.attname FROM pg_catalog.pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(n, o)"
        " JOIN pg_catalog.pg_attribute a ON a.attnum = k.n"
        " WHERE i.indrelid = %s AND i.indisprimary AND a.attrelid = i.indrelid ORDER BY k.o",
        [oid],
    )
    return [r[0] for r in rows]


def _row_name(alias: str, columns: list[str]) -> sql.Composable:
    """Text naming row ``alias`` by ``columns``: ``id = 42`` (``ctid (0,7)`` without columns)."""
    if not columns:
        return sql.SQL("'ctid ' || {}.ctid::text").format(sql.Identifier(alias))
    return sql.SQL(" || ', ' || ").join(
        sql.SQL("{} || coalesce({}.{}::text, 'NULL')").format(
            sql.Literal(f"{c} = "), sql.Identifier(alias), sql.Identifier(c)
        )
        for c in columns
    )


@dataclass(frozen=True)
class Cause:
    """One foreign key that keeps eligible rows of a run's table: ``rows`` eligible rows it
    references directly, from ``referencing`` rows that stay (each count stops at the limit
    it was read with), and one of them, named (``example``)."""

    constraint: str
    table: str  # the referencing table, "schema.table"
    columns: tuple[str, ...]
    rows: int
    referencing: int
    example: str

    def to_json(self) -> dict:
        return {
            "constraint": self.constraint, "table": self.table, "columns": list(self.columns),
            "rows": self.rows, "referencing": self.referencing, "example": self.example,
        }  # fmt: skip

    @staticmethod
    def text(found: dict) -> str:
        """One cause in words: which key, how many rows that stay reference how many eligible
        rows directly, and one of them."""
        return (
            f"{found['constraint']} on {found['table']} ({', '.join(found['columns'])}):"
            f" {found['referencing']:,} row(s) that stay reference {found['rows']:,} directly,"
            f" e.g. {found['example']}"
        )


def referencing_causes(
    spec: PolicySpec, others: list[Edge], selfs: list[Edge], eligible, *, limit: int
) -> list[Cause]:
    """Why eligible rows of the run's table are kept as referenced (``kept_referenced``,
    ``spare_referenced``): per foreign key, the eligible rows a row that stays references
    directly — any row of another table (``others``), a row of the table itself that is not
    eligible (``selfs``) — how many such referencing rows there are, and one of them named by
    its primary key (one statement per key). ``eligible(alias)``: the run's eligibility
    predicate on the row ``alias``. Keys that keep nothing are left out."""
    target = sql.Identifier(spec.schema, spec.table)
    out = []
    for e in [*others, *selfs]:
        elig = eligible("p")
        where = [elig.sql]
        params = list(elig.params)
        if e in selfs:  # the referencing row stays: it is not eligible itself
            stays = eligible("r")
            where.append(sql.SQL("({}) IS NOT TRUE").format(stays.sql))
            params += stays.params
        joined = sql.SQL(
            "FROM {t} AS p JOIN {c} AS r ON {m} WHERE {w}"
        ).format(
            t=target, c=sql.Identifier(e.schema, e.table), m=_match(e, "r", "p"),
            w=sql.SQL(" AND ").join(where),
        )  # fmt: skip
        query = sql.SQL(
            "SELECT (SELECT count(*) FROM (SELECT DISTINCT p.ctid {j} LIMIT %s) AS a),"
            " (SELECT count(*) FROM (SELECT DISTINCT r.ctid {j} LIMIT %s) AS b),"
            " (SELECT {rn} || ' references ' || {pn} {j} LIMIT 1)"
        ).format(
            j=joined, rn=_row_name("r", _primary_key(e.child)), pn=_row_name("p", [*e.referenced])
        )
        with connection.cursor() as cur:
            cur.execute(query.as_string(cur.connection), [*params, limit, *params, limit, *params])
            rows, referencing, example = cur.fetchone()
        if rows:
            out.append(Cause(e.constraint, e.child_name, e.columns, rows, referencing, example))
    return out


def reached_by_cascades(spec: PolicySpec) -> bool:
    """A foreign key of the policy's table cascades from another table (or from itself): a
    DELETE there may remove this table's rows, so other policies' chunks judge them by this
    policy (``protectors``)."""
    return bool(
        _fetch(
            "SELECT 1 FROM pg_catalog.pg_constraint WHERE contype = 'f' AND confdeltype = 'c'"
            " AND conrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) LIMIT 1",
            [spec.schema, spec.table],
        )
    )


def graph_of(spec: PolicySpec) -> Graph:
    """Every table a DELETE on the policy's table reaches by cascades. SpecError naming the
    foreign key when a cascade cannot be followed: a cycle through two or more tables (a table
    referencing itself is followed), or a chain deeper than ``MAX_DEPTH`` tables."""
    (root,) = _fetch(
        "SELECT to_regclass(quote_ident(%s) || '.' || quote_ident(%s))::oid",
        [spec.schema, spec.table],
    )[0]
    graph = Graph(root, {root: spec.qualified_table})
    if root is None:
        return graph

    def visit(oid: int, path: tuple[int, ...]) -> None:
        edges = graph.edges.setdefault(oid, cascading_keys(oid))
        for edge in edges:
            graph.names.setdefault(edge.child, edge.child_name)
            if edge.child == oid:
                continue  # a table referencing itself: followed recursively by the guard
            if edge.child in path:
                raise SpecError(
                    f"foreign key {edge} cascades back to {graph.names[edge.child]}: a cycle of "
                    f"cascades through several tables cannot be checked for protected rows; "
                    f"change its ON DELETE action"
                )
            if len(path) > MAX_DEPTH:
                raise SpecError(
                    f"foreign key {edge} is more than {MAX_DEPTH} cascades below "
                    f"{spec.qualified_table}: so deep a cascade cannot be checked for "
                    f"protected rows; change its ON DELETE action"
                )
            visit(edge.child, (*path, edge.child))

    visit(root, (root,))
    return graph


@dataclass(frozen=True)
class Protector:
    """An approved policy whose table a cascade reaches, with the cutoff it judges by."""

    spec: PolicySpec
    policy_id: int
    cutoff: datetime


def protectors(
    graph: Graph, *, spec: PolicySpec, policy_id: int, cutoff: datetime, tick: datetime
) -> dict[str, list[Protector]]:
    """The approved policies of the tables in ``graph``, by table: the run's own policy with
    the run's cutoff, every other with its cutoff for the run's tick."""
    found: dict[str, list[Protector]] = {spec.qualified_table: [Protector(spec, policy_id, cutoff)]}
    tables = set(graph.names.values())
    approved = PolicyVersion.objects.filter(state=PolicyVersion.State.APPROVED).exclude(
        policy_id=policy_id
    )
    for version in approved.select_related("policy"):
        other = version.parsed
        if other.qualified_table in tables:
            found.setdefault(other.qualified_table, []).append(
                Protector(other, version.policy_id, other.cutoff_for(tick))
            )
    return found


def guard(graph: Graph, by_table: dict[str, list[Protector]]) -> P.Fragment:
    """TRUE for a row of the root table (``t``) whose cascade reaches no protected row: one
    ``NOT EXISTS`` per cascading foreign key, recursively (TRUE without cascades)."""
    if not graph.cascades:
        return P.Fragment(sql.SQL("TRUE"), [])
    return _Builder(graph, by_table).children_ok(graph.root, "t", depth=0)


class _Builder:
    def __init__(self, graph: Graph, by_table: dict[str, list[Protector]]) -> None:
        self.graph = graph
        self.by_table = by_table
        self.aliases = 0

    def alias(self, prefix: str) -> str:
        self.aliases += 1
        return f"{prefix}{self.aliases}"

    # aliases are passed as names (``P.aliased`` takes one) and quoted where they are written

    def unprotected(self, oid: int, alias: str) -> P.Fragment:
        """Every approved policy of table ``oid`` would delete row ``alias``."""
        parts = []
        with P.aliased(alias):
            for p in self.by_table.get(self.graph.names[oid], []):
                parts.append(P.eligible(p.spec, policy_id=p.policy_id, cutoff=p.cutoff))
        return P.Fragment.join(parts, " AND ") if parts else P.Fragment(sql.SQL("TRUE"), [])

    def deletable(self, oid: int, alias: str, depth: int, *, own: bool) -> P.Fragment:
        """Row ``alias`` of table ``oid`` may go with everything its cascade reaches (``own``:
        its descendants in its own table are checked already, by the caller's recursion)."""
        parts = [self.unprotected(oid, alias), self.children_ok(oid, alias, depth, own=own)]
        return P.Fragment.join(parts, " AND ")

    def children_ok(self, oid: int, alias: str, depth: int, *, own: bool = False) -> P.Fragment:
        edges = self.graph.edges.get(oid, [])
        parts = []
        selfs = [e for e in edges if e.child == oid]
        if selfs and not own:
            parts.append(self.descendants_ok(oid, selfs, alias, depth))
        for edge in edges:
            if edge.child == oid:
                continue
            c = self.alias("c")
            ok = self.deletable(edge.child, c, depth + 1, own=False)
            text = sql.SQL("NOT EXISTS (SELECT 1 FROM {} AS {} WHERE {} AND ({}) IS NOT TRUE)")
            parts.append(
                P.Fragment(
                    text.format(
                        sql.Identifier(edge.schema, edge.table),
                        sql.Identifier(c),
                        _match(edge, c, alias),
                        ok.sql,
                    ),
                    ok.params,
                )
            )
        return P.Fragment.join(parts, " AND ") if parts else P.Fragment(sql.SQL("TRUE"), [])

    def descendants_ok(self, oid: int, selfs: list[Edge], alias: str, depth: int) -> P.Fragment:
        """Every row of table ``oid`` that references row ``alias`` through its own cascading
        keys, at any depth, may go: a recursive walk on the referencing columns' index, whose
        rows (by ``ctid``) are then judged like any other."""
        edge0 = selfs[0]
        carried = list(dict.fromkeys(c for e in selfs for c in e.referenced))
        reach_name, c_name, d_name = self.alias("reach"), self.alias("c"), self.alias("c")
        reach, c, d = sql.Identifier(reach_name), sql.Identifier(c_name), sql.Identifier(d_name)
        names = [f"r{i}" for i in range(len(carried))]
        target = sql.Identifier(edge0.schema, edge0.table)
        carry = sql.SQL(", ").join(sql.SQL("{}.{}").format(c, sql.Identifier(x)) for x in carried)
        # the rows referencing the row, then the rows referencing those, …; UNION, so a cycle
        # of references ends; one recursive step for all the table's own keys (a recursive
        # query may read itself once)
        seeds = sql.SQL(" UNION ").join(
            sql.SQL("SELECT {c}.ctid, {carry} FROM {t} AS {c} WHERE {m}").format(
                c=c, carry=carry, t=target, m=_match(e, c_name, alias)
            )
            for e in selfs
        )
        step = sql.SQL("SELECT {c}.ctid, {carry} FROM {r} JOIN {t} AS {c} ON {m}").format(
            c=c, carry=carry, r=reach, t=target,
            m=sql.SQL(" OR ").join(
                sql.SQL("({})").format(
                    _match(e, c_name, reach_name, [names[carried.index(x)] for x in e.referenced])
                )
                for e in selfs
            ),
        )  # fmt: skip
        ok = self.deletable(oid, d_name, depth, own=True)
        text = sql.SQL(
            "NOT EXISTS (WITH RECURSIVE {reach} (tid, {names}) AS ({seeds} UNION {step})"
            " SELECT 1 FROM {reach} JOIN {t} AS {d} ON {d}.ctid = {reach}.tid"
            " WHERE ({ok}) IS NOT TRUE)"
        ).format(
            reach=reach, names=sql.SQL(", ").join(map(sql.Identifier, names)), seeds=seeds,
            step=step, t=target,
            d=d, ok=ok.sql,
        )  # fmt: skip
        return P.Fragment(text, ok.params)


@dataclass(frozen=True)
class Lock:
    """One statement of ``lock_reach``: it locks rows of ``table`` and returns how many;
    ``again``: run it again until that number stays the same (a table referencing itself)."""

    table: str
    statement: P.Fragment
    again: bool


def lock_reach(graph: Graph, chunk: P.Fragment) -> list[Lock]:
    """``SELECT … FOR UPDATE`` of every row the cascades of the chunk's rows (``chunk``: the
    condition on the target's row ``t`` that ``predicate.chunk_rows`` gives, those rows locked
    already by ``predicate.lock_chunk``) will reach, table by table from the top, before the
    DELETE judges them. An application's change to one of them (a line marked disputed, made
    young, given a hold's tenant) either committed before its lock was granted — and the
    DELETE's snapshot, taken after, judges the row on its committed value — or waits until the
    chunk has committed; and a row locked ``FOR UPDATE`` takes no new reference, so the level
    below, locked next, is complete. Rows of a table that references itself are found by a
    recursive walk: its statement runs again until it locks no more rows (a reference made
    while it walked)."""
    if not graph.cascades:
        return []
    return _Locker(graph, chunk).statements()


class _Locker:
    def __init__(self, graph: Graph, chunk: P.Fragment) -> None:
        self.graph, self.chunk = graph, chunk
        self.aliases = 0

    def alias(self, prefix: str) -> str:
        self.aliases += 1
        return f"{prefix}{self.aliases}"

    def ident(self, oid: int) -> sql.Identifier:
        return sql.Identifier(*self.graph.names[oid].split(".", 1))

    def selfs(self, oid: int) -> list[Edge]:
        return [e for e in self.graph.edges.get(oid, []) if e.child == oid]

    def statements(self) -> list[Lock]:
        out: list[Lock] = []
        root = self.graph.root
        if self.selfs(root):
            out.append(self._lock_walk(root, self.in_chunk))

        def visit(oid: int, member) -> None:
            for edge in self.graph.edges.get(oid, []):
                if edge.child == oid:
                    continue

                def direct(alias: str, edge=edge, member=member) -> P.Fragment:
                    return self.via(edge, alias, member)

                child = edge.child
                x = self.alias("x")
                out.append(self._lock(child, x, direct(x), again=False))
                reached = direct
                if self.selfs(child):
                    out.append(self._lock_walk(child, direct))

                    def reached(alias: str, child=child, direct=direct) -> P.Fragment:
                        return P.Fragment.join(
                            [direct(alias), self.descends(child, alias, direct)], " OR "
                        )

                visit(child, reached)

        def root_member(alias: str) -> P.Fragment:
            own = self.in_chunk(alias)
            if not self.selfs(root):
                return own
            return P.Fragment.join([own, self.descends(root, alias, self.in_chunk)], " OR ")

        visit(root, root_member)
        return out

    def in_chunk(self, alias: str) -> P.Fragment:
        """Row ``alias`` of the target is one of the chunk's rows (the chunk's own condition
        where the row is read as ``t``)."""
        if alias == "t":
            return P.Fragment(self.chunk.sql, list(self.chunk.params))
        return P.Fragment(
            sql.SQL("EXISTS (SELECT 1 FROM {} AS t WHERE t.ctid = {}.ctid AND {})").format(
                self.ident(self.graph.root), sql.Identifier(alias), self.chunk.sql
            ),
            list(self.chunk.params),
        )

    def via(self, edge: Edge, alias: str, member) -> P.Fragment:
        """Row ``alias`` of ``edge.child`` references a row of its parent that ``member``
        (a condition on an alias) says is reached."""
        p = "t" if edge.parent == self.graph.root else self.alias("p")
        inner = member(p)
        return P.Fragment(
            sql.SQL("EXISTS (SELECT 1 FROM {} AS {} WHERE {} AND ({}))").format(
                self.ident(edge.parent), sql.Identifier(p), _match(edge, alias, p), inner.sql
            ),
            inner.params,
        )

    def descends(self, oid: int, alias: str, seed) -> P.Fragment:
        """Row ``alias`` of table ``oid`` references, through the table's own cascading keys
        at any depth, a row ``seed`` (a condition on an alias) says is reached."""
        reach, walk = self.walk(oid, seed)
        return P.Fragment(
            sql.SQL("EXISTS (WITH RECURSIVE {} SELECT 1 FROM {} WHERE {})").format(
                walk.sql, sql.Identifier(reach), self.hit(oid, alias, reach)
            ),
            walk.params,
        )

    def walk(self, oid: int, seed) -> tuple[str, P.Fragment]:
        """The recursive query (``name AS (…)``, its name) of the referenced columns' values of
        the rows ``seed`` says are reached, and of every row of table ``oid`` that references
        one of them through the table's own cascading keys, at any depth (``UNION``: a cycle
        of references ends)."""
        carried = self.carried(oid)
        reach_name, s_name, c_name = self.alias("reach"), self.alias("s"), self.alias("c")
        if oid == self.graph.root:
            s_name = "t"  # the chunk's condition reads the target's row as ``t``
        s, c = sql.Identifier(s_name), sql.Identifier(c_name)
        inner = seed(s_name)

        def carry(a: sql.Identifier) -> sql.Composable:
            return sql.SQL(", ").join(
                sql.SQL("{}.{}").format(a, sql.Identifier(x)) for x in carried
            )

        text = sql.SQL(
            "{reach} ({names}) AS (SELECT {sc} FROM {t} AS {s} WHERE {seed}"
            " UNION SELECT {cc} FROM {reach} JOIN {t} AS {c} ON {step})"
        ).format(
            reach=sql.Identifier(reach_name),
            names=sql.SQL(", ").join(sql.Identifier(f"r{i}") for i in range(len(carried))),
            sc=carry(s), t=self.ident(oid), s=s, seed=inner.sql, cc=carry(c), c=c,
            step=self.hit(oid, c_name, reach_name),
        )  # fmt: skip
        return reach_name, P.Fragment(text, inner.params)

    def carried(self, oid: int) -> list[str]:
        return list(dict.fromkeys(c for e in self.selfs(oid) for c in e.referenced))

    def hit(self, oid: int, alias: str, reach: str) -> sql.Composable:
        """Row ``alias`` references a row of the walk ``reach`` by one of the table's own keys."""
        carried = self.carried(oid)
        return sql.SQL(" OR ").join(
            sql.SQL("({})").format(
                _match(e, alias, reach, [f"r{carried.index(x)}" for x in e.referenced])
            )
            for e in self.selfs(oid)
        )

    def _lock(self, oid: int, alias: str, where: P.Fragment, *, again: bool) -> Lock:
        x = sql.Identifier(alias)
        text = sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {} AS {} WHERE {} FOR UPDATE OF {}) AS l"
        ).format(self.ident(oid), x, where.sql, x)
        return Lock(self.graph.names[oid], P.Fragment(text, where.params), again)

    def _lock_walk(self, oid: int, seed) -> Lock:
        """Lock the rows of table ``oid`` that reference, through its own keys at any depth, a
        row ``seed`` says is reached (the walk at the statement's top, so that its rows join the
        table on the referencing columns' index)."""
        reach, walk = self.walk(oid, seed)
        x = self.alias("x")
        text = sql.SQL(
            "WITH RECURSIVE {} SELECT count(*) FROM (SELECT 1 FROM {} AS {x}"
            " WHERE EXISTS (SELECT 1 FROM {} WHERE {}) FOR UPDATE OF {x}) AS l"
        ).format(
            walk.sql, self.ident(oid), sql.Identifier(reach), self.hit(oid, x, reach),
            x=sql.Identifier(x),
        )  # fmt: skip
        return Lock(self.graph.names[oid], P.Fragment(text, walk.params), True)


def for_run(
    spec: PolicySpec, *, policy_id: int, cutoff: datetime, tick: datetime
) -> tuple[Graph, P.Fragment | None]:
    """The cascades of a run's table and the guard its DELETE and verification carry (None
    when no cascading foreign key references the table). The graph is read once per
    ``predicate.cached_types`` scope; the approved policies it protects, every time (a version
    approved since must be respected by the next chunk)."""
    graph = P.scoped(("cascades", spec.schema, spec.table), lambda: graph_of(spec))
    if not graph.cascades:
        return graph, None
    by_table = protectors(graph, spec=spec, policy_id=policy_id, cutoff=cutoff, tick=tick)
    return graph, guard(graph, by_table)


def _match(edge: Edge, child: str, parent: str, parent_cols=None) -> sql.Composable:
    """Row ``child`` references row ``parent`` by ``edge``'s columns (``parent_cols``: the
    names the parent's referenced columns go by, when not their own)."""
    parent_cols = parent_cols or list(edge.referenced)
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(
            sql.Identifier(child), sql.Identifier(x), sql.Identifier(parent), sql.Identifier(y)
        )
        for x, y in zip(edge.columns, parent_cols, strict=True)
    )


def deleted_rows(graph: Graph) -> P.Fragment:
    """Rows deleted in the current transaction so far, per table of ``graph`` (every leaf of a
    partitioned one summed): ``(table, rows)``, from PostgreSQL's per-transaction statistics.
    Read before and after a chunk's DELETE, the difference is what it removed in each table,
    cascades included."""
    oids = list(graph.names)
    return P.Fragment(
        sql.SQL(
            "SELECT r.oid, coalesce((SELECT sum(pg_catalog.pg_stat_get_xact_tuples_deleted(p.relid))"
            "  FROM pg_catalog.pg_partition_tree(r.oid) AS p WHERE p.isleaf),"
            "  pg_catalog.pg_stat_get_xact_tuples_deleted(r.oid))::bigint"
            " FROM unnest(%s::oid[]) AS r(oid)"
        ),
        [oids],
    )
