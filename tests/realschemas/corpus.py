"""Real schemas: the DDL of public projects' large tables, filled, drained, judged.

Each ``Case`` names a DDL file in ``ddl/`` (taken from the project's repository; the file
names the repository, the path and the commit), loads it as written into a scratch schema
``rs_<name>``, fills it with plausible rows (``INSERT … SELECT generate_series``, arithmetic
only: the same rows every time), approves the policies a real administrator would write (policy
files, read by the product's own parser) with the product's own actions, places the legal holds, drains each policy with the real engine
and judges the outcome:

- ``runs.evidence.invariants.check_run`` against a shadow copy of the policy's table (no
  held, kept or young row gone, every eligible row gone, rows gone = rows audited);
- every table of the schema, policy target or not, compared as a multiset of whole rows with
  its own shadow copy: a table no policy targets loses and changes nothing, a target loses
  exactly the rows its audit records count and changes none (a cascade, a ``SET NULL`` or a
  trigger anywhere shows up here);
- for a partitioned table, what the runs did with whole partitions (``PartitionAction`` states
  counted; a partition may live in a schema of its own, ``Case.schemas``, as GitLab keeps
  them): the rows alone cannot tell a partition dropped whole from one deleted in chunks.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count
from psycopg import sql

from retention import actions as retention_actions
from retention.spec import load_toml
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import Shadow, check_run
from runs.models import AuditRecord, PartitionAction, Run
from tests.factories import approved_policy
from tests.runs.shapes import fast_user

DDL = Path(__file__).resolve().parent / "ddl"
# Every policy ticks at 03:00 UTC; runs are triggered for this tick.
TICK = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
T = "timestamptz '2026-11-30 03:00+00'"  # the tick, in fill SQL
T_MS = "(extract(epoch FROM timestamptz '2026-11-30 03:00+00') * 1000)::bigint"
T_S = "extract(epoch FROM timestamptz '2026-11-30 03:00+00')::bigint"


@dataclasses.dataclass(frozen=True)
class Hold:
    """A legal hold on one policy of the case (``policy``: its slug)."""

    policy: str
    tenant: str | None = None
    key_from: int | None = None
    key_to: int | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # the scratch schema is rs_<name>
    project: str
    ddl: str  # file in ddl/
    fill: tuple[str, ...]  # SQL run with search_path = the scratch schema; {T}, {T_MS}, {T_S}, {S}
    policies: tuple[str, ...]  # policy files (TOML); {schema} is the scratch schema
    holds: tuple[Hold, ...] = ()
    # other scratch schemas the fill writes to, each rs_<name>_<suffix> ({S} in fill SQL is
    # the scratch schema): a partitioned table's partitions where the project keeps them
    schemas: tuple[str, ...] = ()
    # what the runs must have done with whole partitions: PartitionAction state -> count
    partitions: tuple[tuple[str, int], ...] = ()
    # settings the worker login carries (ALTER ROLE … SET, as the project asks an operator to
    # do), set on the session that drains the runs
    session: tuple[tuple[str, str], ...] = ()
    # rows the runs change by the schema's own rules (ON DELETE SET NULL): the same rule
    # applied to the shadow after the runs, an UPDATE of the rows still there ({S}: the scratch
    # schema, {SH}: its shadow), before anything is judged; every other row of every table must
    # be unchanged
    changes: tuple[str, ...] = ()
    # old rows a row that stays references through a key that forbids their deletion (another
    # table's deferred key, the table's own): each run's verification counts some as kept
    kept_referenced: bool = False

    @property
    def schema(self) -> str:
        return f"rs_{self.name}"

    @property
    def shadow_schema(self) -> str:
        return f"rs_{self.name}_shadow"

    @property
    def scratch_schemas(self) -> list[str]:
        """Every schema the case makes, the table's own first (dropping it drops the
        partitions kept elsewhere with their parent)."""
        return [self.schema, self.shadow_schema] + [f"{self.schema}_{s}" for s in self.schemas]


@dataclasses.dataclass
class Outcome:
    problems: list[str]
    rows: dict[str, int]  # table -> rows before the run
    gone: dict[str, int]  # table -> rows gone or changed
    audited: dict[str, int]  # qualified table -> rows the audit records count
    chunks: int
    seconds: float
    runs: list[Run]
    partitions: dict[str, int]  # PartitionAction state -> count
    changed: list[int]  # rows each of the case's ``changes`` updated in the shadow


def _exec(cur, statement: str, params=None) -> None:
    cur.execute(statement, params or [])


def load(case: Case) -> None:
    """The scratch schema with the case's DDL as written, filled, analyzed."""
    text = (DDL / case.ddl).read_text()
    with transaction.atomic(), connection.cursor() as cur:
        for schema in case.scratch_schemas:
            _exec(
                cur,
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                .format(sql.Identifier(schema))
                .as_string(cur.connection),
            )
            _exec(
                cur,
                sql.SQL("CREATE SCHEMA {}")
                .format(sql.Identifier(schema))
                .as_string(cur.connection),
            )
        # the DDL and the fill as written, unqualified, in the scratch schema; then the
        # connection's own search path again (a test's transaction outlives this block)
        cur.execute("SELECT current_setting('search_path')")
        (previous,) = cur.fetchone()
        _exec(cur, "SELECT set_config('search_path', %s, true)", [case.schema])
        cur.execute(text)
        for statement in case.fill:
            cur.execute(statement.format(T=T, T_MS=T_MS, T_S=T_S, S=case.schema))
        _exec(cur, "SELECT set_config('search_path', %s, true)", [previous])
    with connection.cursor() as cur:
        for table in tables(case.schema):
            cur.execute(
                sql.SQL("ANALYZE {}")
                .format(sql.Identifier(case.schema, table))
                .as_string(cur.connection)
            )


def tables(schema: str) -> list[str]:
    """The schema's tables: ordinary and partitioned parents (a partition is counted through
    its parent)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " ORDER BY 1",
            [schema],
        )
        return [r[0] for r in cur.fetchall()]


def _count(cur, query: sql.Composable) -> int:
    cur.execute(query.as_string(cur.connection))
    return cur.fetchone()[0]


def take_shadows(case: Case) -> dict[str, int]:
    rows = {}
    with connection.cursor() as cur:
        for table in tables(case.schema):
            live = sql.Identifier(case.schema, table)
            shadow = sql.Identifier(case.shadow_schema, table)
            cur.execute(
                sql.SQL("CREATE TABLE {} AS SELECT * FROM {}")
                .format(shadow, live)
                .as_string(cur.connection)
            )
            rows[table] = _count(cur, sql.SQL("SELECT count(*) FROM {}").format(shadow))
    return rows


def rows_gone_or_changed(case: Case, table: str) -> tuple[int, int]:
    """(rows of the shadow no longer in the table, rows of the table not in the shadow), each
    as a multiset of whole rows: an updated row counts in both."""
    live = sql.Identifier(case.schema, table)
    shadow = sql.Identifier(case.shadow_schema, table)
    with connection.cursor() as cur:
        gone = _count(
            cur,
            sql.SQL(
                "SELECT count(*) FROM (SELECT x::text FROM {} x EXCEPT ALL SELECT y::text FROM {} y) g"
            ).format(shadow, live),
        )
        new = _count(
            cur,
            sql.SQL(
                "SELECT count(*) FROM (SELECT y::text FROM {} y EXCEPT ALL SELECT x::text FROM {} x) g"
            ).format(live, shadow),
        )
    return gone, new


def _keeper() -> User:
    return User.objects.filter(username="legal-keeper").first() or fast_user(
        "legal-keeper", "compliance"
    )


def run_case(case: Case) -> Outcome:
    """Load, approve, hold, drain every policy of the case, and judge every table."""
    started = time.monotonic()
    load(case)
    policies = {}
    for text in case.policies:
        text = text.replace("{schema}", case.schema)
        spec = load_toml(text)  # the file as the product reads one (retention policy apply)
        policies[spec.slug] = approved_policy(fast_user, **tomllib.loads(text))
    for hold in case.holds:
        retention_actions.place_hold(
            actor=_keeper(),
            reason=f"{case.project}: litigation hold",
            policy=policies[hold.policy],
            tenant=hold.tenant,
            key_from=hold.key_from,
            key_to=hold.key_to,
        )
    rows = take_shadows(case)

    problems: list[str] = []
    runs = []
    with connection.cursor() as cur:
        for name, value in case.session:
            _exec(cur, "SELECT set_config(%s, %s, false)", [name, value])
    for slug, policy in policies.items():
        run, _ = trigger_run(policy, tick=TICK)
        worker.drain(run.pk, budget_s=120)
        run.refresh_from_db()
        runs.append(run)
        if run.state != Run.State.DRAINED:
            problems.append(f"{slug}: the run ended {run.state}: {run.state_reason}")
    changed = []
    with connection.cursor() as cur:
        for name, _value in case.session:
            _exec(cur, "SELECT set_config(%s, '', false)", [name])
        for update in case.changes:
            cur.execute(update.format(S=case.schema, SH=case.shadow_schema))
            changed.append(cur.rowcount)
    for run in runs:
        table = run.policy_version.parsed.table
        problems += [
            f"{run.policy.slug}: {p}"
            for p in check_run(run, shadow=Shadow(case.shadow_schema, table, None))
        ]

    # a chunk's record counts per table what it removed where cascades reach (table_rows),
    # else its own table's rows
    audited: dict[str, int] = {}
    for table_name, rows_deleted, table_rows in AuditRecord.objects.filter(
        run__in=runs
    ).values_list("table_name", "rows_deleted", "table_rows"):
        for name, n in (table_rows or {table_name: rows_deleted}).items():
            audited[name] = audited.get(name, 0) + n
    gone = {}
    for table in tables(case.schema):
        lost, new = rows_gone_or_changed(case, table)
        gone[table] = lost
        expected = audited.get(f"{case.schema}.{table}", 0)
        if lost != expected:
            problems.append(f"{table}: {lost} row(s) gone, {expected} audited")
        if new:
            problems.append(f"{table}: {new} row(s) changed by the runs")
    chunks = AuditRecord.objects.filter(run__in=runs).count()
    partitions = {
        row["state"]: row["n"]
        for row in PartitionAction.objects.filter(run__in=runs)
        .values("state")
        .annotate(n=Count("id"))
    }
    return Outcome(
        problems, rows, gone, audited, chunks, time.monotonic() - started, runs, partitions,
        changed,
    )  # fmt: skip
