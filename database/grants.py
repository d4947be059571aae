"""What each database login of a deployment may do, declared once: ``retention grants apply``
gives a login exactly that (idempotent), ``retention grants check`` prints every privilege a
login holds beyond it (and anything missing), ``retention grants sql`` prints the statements
(the shipped ``deploy/sql/grants.sql`` is their output; a test keeps the two equal).

The logins (docs/deploy.md, "Database logins"):

- ``owner`` — runs ``migrate`` and ``retention grants apply``; owns the product's schema and
  tables; not used by any running process.
- ``web`` — gunicorn: the pages, people, roles and tokens. Reads everything of the product,
  writes the state operators change; never the audit trail; ``SELECT`` on targets (previews).
- ``worker`` — the cleanup clusters and ``retention drain``: ``SELECT, DELETE`` on targets,
  the ledger, append-only audit rows; reads policies and holds, changes no operator decision
  (database/migrations: ``rr_policy_decisions``, ``rr_run_decisions``); no ``pg_monitor``
  (the guard reads other sessions through ``guard_*_signals``); nothing any process unpickles
  (django-q2's results go to the cluster cache as signed JSON, not to ``django_q_task``).
- ``operator`` — read-only: ``status``, ``explain``, ``check`` and ``audit verify`` on the
  server. It writes no decision, hold, person, operator-log row or task: operators decide
  over the HTTP API (the ``retention`` client needs no database login), where the web
  process signs each decision (``signatures``).
- ``monitor`` — the checkpoint job: reads the chains and stores signed checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from database.schema import product_table_names

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
R = frozenset({"SELECT"})
RI = frozenset({"SELECT", "INSERT"})
RIU = frozenset({"SELECT", "INSERT", "UPDATE"})
RID = frozenset({"SELECT", "INSERT", "DELETE"})
RIUD = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})

# People, memberships, tokens and sessions: what the operator login may read, never write.
PEOPLE = (
    "auth.User",
    "auth.Group",
    "auth.User_groups",
    "auth.User_user_permissions",
    "auth.Group_permissions",
    "auth.Permission",
    "core.ApiToken",
    "core.AccountSeal",
    "sessions.Session",
)
GUARD_FUNCTIONS = ("guard_instance_signals()", "guard_table_signals(regclass, text[])")


@dataclass(frozen=True)
class Login:
    purpose: str
    # model label (or a table of the product's schema) -> table privileges
    tables: dict[str, frozenset[str]] = field(default_factory=dict)
    # privileges on every other table of the product's schema
    default: frozenset[str] = frozenset()
    # model label -> {privilege: columns}
    columns: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    functions: tuple[str, ...] = ()
    # on each target table of a policy
    targets: frozenset[str] = frozenset()


WEB_WRITES = {
    # people, roles, tokens, sessions, sign-in throttling (axes), the admin's log
    **dict.fromkeys(PEOPLE, RIUD),
    "admin.LogEntry": RI,
    "axes.AccessAttempt": RIUD,
    "axes.AccessAttemptExpiration": RIUD,
    "axes.AccessLog": RIUD,
    "axes.AccessFailureLog": RIUD,
    "core_cache": RIUD,
    # django-q2's Stat.get_all() (/healthz, worker liveness) prunes expired keys as it reads
    "core_cluster_cache": RIUD,
    # the state operators change
    "retention.Policy": RIU,
    "retention.PolicyVersion": RIU,
    "retention.LegalHold": RIU,
    "retention.KillSwitch": RIU,
    "retention.RetentionFloor": RIU,
    # a person's operator-log rows and decisions, each signed in this process (signatures/)
    "core.OperatorAction": RI,
    "signatures.Signature": RI,
    "runs.Run": RIU,
    "runs.Chunk": RIU,
    "runs.PlannerCursor": RIU,
    "runs.Lease": RIU,
    "runs.DeadLetter": RIU,
    "runs.PartitionAction": RIU,
    # restores of archived rows: requested and approved by compliance (runs.restores)
    "runs.RestoreRequest": RIU,
    # enqueueing work and arming schedules; results are never read
    "django_q.OrmQ": RI,
    "django_q.Schedule": RIUD,
    "django_q.Task": frozenset(),
}

LOGINS: dict[str, Login] = {
    "web": Login(
        purpose="gunicorn: the pages, people, roles and tokens",
        tables=WEB_WRITES,
        default=R,
        targets=R,
    ),
    "operator": Login(
        purpose="read-only: status, explain, check and audit verify on the server (operators"
        " decide over the HTTP API with the `retention` client, which needs no database login)",
        tables={
            # no write anywhere: no decision, hold, person, operator-log row or task (the
            # queue is read for a run's backlog in `status`)
            "sessions.Session": frozenset(),
            "django_q.Task": frozenset(),
            # the pages' cache of derived numbers (JSON only: core.cache), which `status` fills
            "core_cache": RIUD,
        },
        default=R,
        targets=R,
    ),
    "worker": Login(
        purpose="the cleanup clusters and `retention drain`",
        tables={
            "runs.Run": RIU,
            "runs.Chunk": RIU,
            "runs.PlannerCursor": RIU,
            "runs.Lease": RIU,
            "runs.DeadLetter": RI,
            "runs.PartitionAction": RIU,
            "runs.GuardSample": RID,
            # the guard's latency controller: its row per policy (stepped under its row lock,
            # SELECT … FOR UPDATE) and its steps (pruned with the samples)
            "runs.GuardControl": RIU,
            "runs.GuardControlStep": RID,
            "runs.AuditRecord": RI,
            "core.OperatorAction": RI,
            "retention.Policy": R,
            "retention.PolicyVersion": R,
            "retention.LegalHold": R,
            "retention.KillSwitch": R,
            "retention.RetentionFloor": R,
            "signatures.Signature": R,
            # the registered targets (names and where their connection strings come from,
            # never the strings) and the decisions' generation a target's mirror is synced to
            "targets.Target": R,
            "targets.Generation": R,
            # a lease re-enqueues its next generation (the clusters run only the product's
            # entry points: runs.engine.payloads)
            "django_q.OrmQ": RIUD,
            "django_q.Schedule": RIUD,
            "core_cluster_cache": RIUD,
        },
        # the guard pauses a policy at a critical reading (and lifts its own pause only)
        columns={"retention.Policy": {"UPDATE": ("paused", "paused_reason")}},
        functions=("runs_try_slot(integer, integer[])", *GUARD_FUNCTIONS),
        targets=frozenset({"SELECT", "DELETE"}),
    ),
    "monitor": Login(
        purpose="the checkpoint job: reads the chains, stores signed checkpoints",
        tables={
            "runs.Checkpoint": RI,
            # the registered targets, whose chains it signs too (names and references only)
            "targets.Target": R,
            "runs.AuditRecord": R,
            "runs.Chunk": R,
            "runs.Run": R,
            "core.OperatorAction": R,
            "retention.Policy": R,
            "retention.PolicyVersion": R,
            "retention.LegalHold": R,
            "signatures.Signature": R,
        },
    ),
}


# In a target's ledger (``retention target migrate``): the worker syncs the mirror of the
# control database's decisions there before its chunks (``runs.fleet.mirror``) — policies,
# versions, holds, the kill switch, the signatures that vouch for them, the users the versions
# name (without passwords) and their seals, and the generation it synced to — and works the
# ledger as on the control database; the queue, schedules and the cluster's cache stay on the
# control database. Writing the kill switch's mirror makes it a login that may decide *there*
# (``rr_may_decide``): on a target the decisions that count are the control database's,
# brought through the gate and checked by their signatures (docs/fleet.md).
MIRROR = (
    "retention.Policy",
    "retention.PolicyVersion",
    "retention.LegalHold",
    "retention.KillSwitch",
    "core.AccountSeal",
    "auth.User",
    "targets.Generation",
)
CONTROL_ONLY = ("django_q.OrmQ", "django_q.Schedule", "core_cluster_cache", "targets.Target")

TARGET_LOGINS: dict[str, Login] = {
    "worker": Login(
        purpose="the cleanup clusters and `retention drain`, on a target's ledger",
        tables={
            **{k: v for k, v in LOGINS["worker"].tables.items() if k not in CONTROL_ONLY},
            **dict.fromkeys(MIRROR, RIU),
            "signatures.Signature": RI,
        },
        functions=LOGINS["worker"].functions,
        targets=LOGINS["worker"].targets,
    ),
    # the checkpoint job reads a target's chains; their anchors are stored in the control
    # database, out of the target's logins' reach
    "monitor": Login(
        purpose="the checkpoint job, reading a target's chains",
        tables={
            k: v
            for k, v in LOGINS["monitor"].tables.items()
            if k not in ("runs.Checkpoint", *CONTROL_ONLY)
        },
    ),
}


class GrantError(Exception):
    """A login, target or privilege that cannot be granted as asked."""


def schema() -> str:
    return settings.DB_SCHEMA


def _table_of(name: str) -> str:
    if "." in name:
        return apps.get_model(name)._meta.db_table
    return name


def expected_tables(login: Login) -> dict[str, frozenset[str]]:
    """Table -> privileges, for every table of the product's schema this login touches."""
    explicit: dict[str, frozenset[str]] = {}
    for name, privileges in login.tables.items():
        table = _table_of(name)
        explicit[table] = explicit.get(table, frozenset()) | privileges
    expected = {}
    for table in product_table_names():
        privileges = explicit.get(table, login.default)
        if privileges:
            expected[table] = privileges
    return expected


def expected_columns(login: Login) -> dict[tuple[str, str], tuple[str, ...]]:
    return {
        (_table_of(name), privilege): columns
        for name, by_privilege in login.columns.items()
        for privilege, columns in by_privilege.items()
    }


def _qualified(table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema()), sql.Identifier(table))


def _resolve_target(cursor, target: str) -> tuple[str, str]:
    """(schema, table) of an existing table outside the product's schema."""
    schema_name, _, table = target.rpartition(".")
    if not schema_name or not table:
        raise GrantError(f"--target must be schema.table, got {target!r}")
    cursor.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"
        " AND c.relkind IN ('r', 'p')",
        [schema_name, table],
    )
    row = cursor.fetchone()
    if row is None:
        raise GrantError(f"--target {target}: no such table")
    if row[0] == schema() or row[0] in ("pg_catalog", "information_schema"):
        raise GrantError(f"--target {target}: the product's own tables are never targets")
    return row[0], row[1]


def statements(
    kind: str,
    role: sql.Composable,
    targets: list[tuple[str, str]],
    database: str,
    declared: dict[str, Login] = LOGINS,
):
    """The statements that give ``role`` exactly what login ``kind`` needs (``declared``:
    ``TARGET_LOGINS`` in a target's ledger)."""
    login = declared[kind]
    product = sql.Identifier(schema())
    out = [
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), role),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(product, role),
        sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(product, role),
        sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(product, role),
        sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM {}").format(product, role),
    ]
    for table, privileges in sorted(expected_tables(login).items()):
        out.append(
            sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                sql.SQL(", ").join(sql.SQL(p) for p in TABLE_PRIVILEGES if p in privileges),
                _qualified(table),
                role,
            )
        )
    for (table, privilege), columns in sorted(expected_columns(login).items()):
        out.append(
            sql.SQL("GRANT {} ({}) ON TABLE {} TO {}").format(
                sql.SQL(privilege),
                sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                _qualified(table),
                role,
            )
        )
    for function in login.functions:
        out.append(
            sql.SQL("GRANT EXECUTE ON FUNCTION {}.{} TO {}").format(
                product, sql.SQL(function), role
            )
        )
    if login.targets:
        for target_schema, table in targets:
            out.append(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                    sql.Identifier(target_schema), role
                )
            )
            out.append(
                sql.SQL("GRANT {} ON TABLE {}.{} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in TABLE_PRIVILEGES if p in login.targets),
                    sql.Identifier(target_schema),
                    sql.Identifier(table),
                    role,
                )
            )
    return out


def apply(
    logins: dict[str, str], targets: list[str], declared: dict[str, Login] = LOGINS
) -> tuple[list[str], list[str]]:
    """Give each login (kind -> role name) exactly what its kind needs, in one transaction, in
    the database in place (``declared``: ``TARGET_LOGINS`` in a target's ledger).
    With a worker login, a partitioned target also gets its partition function, created as
    the target's owner when this login may act as that role. Returns the statements run, as
    text, and one line for each partitioned target whose owner must create it instead."""
    done, owed = [], []
    with transaction.atomic(), connection.cursor() as cursor:
        resolved = [_resolve_target(cursor, t) for t in targets]
        for kind, role in logins.items():
            cursor.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                raise GrantError(f"--{kind} {role}: no such role (CREATE ROLE {role} LOGIN …)")
            if kind not in declared:
                raise GrantError(
                    f"--{kind}: on a target's ledger only the "
                    f"{' and '.join(declared)} logins are declared"
                )
            for statement in statements(
                kind, sql.Identifier(role), resolved, connection.settings_dict["NAME"], declared
            ):
                text = statement.as_string(cursor.connection)
                cursor.execute(text)
                done.append(text)
        secured = _row_secured(cursor, resolved)
        if "worker" in logins and secured:
            # a login under row-level security would see, delete and verify only the rows
            # the table's policies show it: the worker drains such a table bypassing them
            text = sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(logins["worker"]))
            try:
                with transaction.atomic():
                    cursor.execute(text.as_string(cursor.connection))
            except DatabaseError as exc:
                raise GrantError(
                    f"row-level security on {', '.join(secured)}: the worker login "
                    f"{logins['worker']} must bypass it, and only a superuser may give it "
                    f"BYPASSRLS ({str(exc).strip().splitlines()[0]}); nothing was granted"
                ) from None
            done.append(text.as_string(cursor.connection))
        if "worker" in logins:
            for target_schema, table in resolved:
                done.extend(
                    _partition_function(cursor, target_schema, table, logins["worker"], owed)
                )
    return done, owed


def _row_secured(cursor, resolved: list[tuple[str, str]]) -> list[str]:
    """The targets among ``resolved`` (schema, table) with row-level security enabled, and
    the tables their ``ON DELETE CASCADE`` keys reach (at any depth) that have it."""
    if not resolved:
        return []
    cursor.execute(
        "WITH RECURSIVE reach(oid) AS ("
        " SELECT to_regclass(quote_ident(s) || '.' || quote_ident(t))::oid"
        "  FROM unnest(%s::text[], %s::text[]) AS x(s, t)"
        " UNION SELECT con.conrelid FROM reach JOIN pg_catalog.pg_constraint con"
        "  ON con.confrelid = reach.oid AND con.contype = 'f' AND con.confdeltype = 'c')"
        " SELECT n.nspname || '.' || c.relname FROM reach"
        " JOIN pg_catalog.pg_class c ON c.oid = reach.oid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relrowsecurity ORDER BY 1",
        [[s for s, _t in resolved], [t for _s, t in resolved]],
    )
    return [name for (name,) in cursor.fetchall()]


def _partition_function(cursor, target_schema: str, table: str, worker: str, owed: list) -> list:
    cursor.execute(
        "SELECT c.relkind = 'p', pg_catalog.pg_get_userbyid(c.relowner),"
        " pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER')"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        [target_schema, table],
    )
    partitioned, owner, may_act = cursor.fetchone()
    if not partitioned:
        return []
    if not may_act:
        owed.append(
            f"{target_schema}.{table} is partitioned: for whole-partition drops, its owner "
            f"{owner} creates the partition function (`retention grants sql`, last section, "
            "as that role); until then its partitions are deleted in chunks"
        )
    texts = []
    for statement in owner_grants(sql.Identifier(owner)):
        texts.append(statement.as_string(cursor.connection))
        cursor.execute(texts[-1])
    if not may_act:
        return texts
    creating = [
        sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)),
        *partition_statements(target_schema, sql.Identifier(owner), sql.Identifier(worker)),
        sql.SQL("RESET ROLE"),
    ]
    try:
        with transaction.atomic():  # a savepoint: the owner may not create in its schema
            for statement in creating:
                texts.append(statement.as_string(cursor.connection))
                cursor.execute(texts[-1])
    except DatabaseError as exc:
        cursor.execute("RESET ROLE")
        owed.append(
            f"{target_schema}.{table} is partitioned, but its owner {owner} could not create "
            f"the partition function ({str(exc).splitlines()[0]}): its partitions are deleted "
            "in chunks"
        )
    return texts


def policy_targets(database: str = "default") -> list[str]:
    """``schema.table`` of every policy's approved or submitted version that deletes from the
    target ``database`` (its ``targets``, groups read now; absent: the control database).
    Read on the control database."""
    tables = set()
    PolicyVersion = apps.get_model("retention", "PolicyVersion")
    Target = apps.get_model("targets", "Target")
    groups = dict(Target.objects.values_list("name", "group"))
    for spec in PolicyVersion.objects.filter(state__in=["approved", "submitted"]).values_list(
        "spec", flat=True
    ):
        named = spec.get("targets") or ["default"]
        group = groups.get(database)
        if database in named or (group and f"group:{group}" in named):
            tables.add(f"{spec.get('schema', 'public')}.{spec['table']}")
    return sorted(tables)


def check(
    kind: str, role: str, targets: list[str], declared: dict[str, Login] = LOGINS
) -> list[str]:
    """Every privilege ``role`` holds beyond what login ``kind`` needs, and everything it needs
    and lacks, one line each (empty: exactly right), in the database in place (``declared``:
    ``TARGET_LOGINS`` in a target's ledger). Privileges every role has through PUBLIC's
    defaults (CONNECT and TEMPORARY on the database, EXECUTE on ordinary functions) are not
    the login's own and are not listed."""
    login = declared[kind]
    problems: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls"
            " FROM pg_catalog.pg_roles WHERE rolname = %s",
            [role],
        )
        row = cursor.fetchone()
        if row is None:
            return [f"no such role {role}"]
        secured = (
            _row_secured(cursor, [_resolve_target(cursor, t) for t in targets])
            if "DELETE" in login.targets
            else []
        )
        for flag, value in zip(
            ("SUPERUSER", "CREATEROLE", "CREATEDB", "REPLICATION", "BYPASSRLS"), row, strict=True
        ):
            if value and not (flag == "BYPASSRLS" and secured):
                problems.append(f"beyond: role attribute {flag}")
        if secured and not row[4]:
            problems.append(
                f"lacks: role attribute BYPASSRLS (row-level security on {', '.join(secured)}:"
                f" without it the login sees, deletes and verifies only some rows)"
            )
        # memberships, direct or inherited: none is needed (pg_monitor reads others' SQL)
        cursor.execute(
            "WITH RECURSIVE m(roleid) AS ("
            " SELECT a.roleid FROM pg_catalog.pg_auth_members a WHERE a.member = %s::regrole"
            " UNION SELECT a.roleid FROM pg_catalog.pg_auth_members a JOIN m ON a.member = m.roleid)"
            " SELECT r.rolname FROM m JOIN pg_catalog.pg_roles r ON r.oid = m.roleid ORDER BY 1",
            [role],
        )
        for (member_of,) in cursor.fetchall():
            problems.append(f"beyond: member of role {member_of}")
        # anything it (or a role it belongs to) owns
        cursor.execute(
            "SELECT kind || ' ' || name FROM ("
            " SELECT 'table', c.oid::regclass::text, c.relowner FROM pg_catalog.pg_class c"
            "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            "  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND c.relkind IN"
            "  ('r', 'p', 'v', 'm', 'f', 'S')"
            " UNION ALL SELECT 'function', p.oid::regprocedure::text, p.proowner"
            "  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
            "  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " UNION ALL SELECT 'schema', nspname, nspowner FROM pg_catalog.pg_namespace"
            " ) o(kind, name, owner) WHERE pg_catalog.pg_has_role(%s, owner, 'USAGE')"
            " ORDER BY 1",
            [role],
        )
        for (owned,) in cursor.fetchall():
            problems.append(f"beyond: owns {owned}")
        cursor.execute("SELECT has_database_privilege(%s, current_database(), 'CREATE')", [role])
        if cursor.fetchone()[0]:
            problems.append("beyond: CREATE on the database")
        cursor.execute(
            "SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE 'pg\\_%%'"
            " AND nspname <> 'information_schema' AND has_schema_privilege(%s, oid, 'CREATE')"
            " ORDER BY 1",
            [role],
        )
        for (name,) in cursor.fetchall():
            problems.append(f"beyond: CREATE on schema {name}")

        wanted = {
            (f"{schema()}.{table}", privilege)
            for table, privileges in expected_tables(login).items()
            for privilege in privileges
        }
        resolved = [_resolve_target(cursor, t) for t in targets]
        wanted |= {
            (f"{target_schema}.{table}", privilege)
            for target_schema, table in resolved
            for privilege in login.targets
        }
        if "DELETE" in login.targets:
            # the partition function lets the workers read a target's partitions (its census)
            # and read and delete what it detached for a run (the census before the drop)
            cursor.execute(
                "SELECT n.nspname || '.' || c.relname, p.privilege FROM ("
                " SELECT t.relid FROM unnest(%s::text[]) AS target,"
                "  pg_catalog.pg_partition_tree(target::regclass) t WHERE t.level > 0"
                " UNION SELECT relid::oid FROM {} ) r"
                " JOIN pg_catalog.pg_class c ON c.oid = r.relid"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " CROSS JOIN unnest(CASE WHEN r.relid IN (SELECT relid::oid FROM {})"
                "  THEN ARRAY['SELECT', 'DELETE'] ELSE ARRAY['SELECT'] END) p(privilege)".replace(
                    "{}", f'"{schema()}".database_detachedpartition'
                ),
                [[f'"{ts}"."{t}"' for ts, t in resolved]],
            )
            allowed = set(cursor.fetchall())
        else:
            allowed = set()
        cursor.execute(
            "SELECT n.nspname || '.' || c.relname, p.privilege"
            " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " CROSS JOIN unnest(%s::text[]) AS p(privilege)"
            " WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg\\_%%'"
            " AND has_table_privilege(%s, c.oid, p.privilege)"
            # PUBLIC's own grants are every role's, not this login's
            " AND NOT EXISTS (SELECT 1 FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) x"
            "  WHERE x.grantee = 0 AND x.privilege_type = p.privilege)",
            [list(TABLE_PRIVILEGES), role],
        )
        held = {(name, privilege) for name, privilege in cursor.fetchall()}
        for name, privilege in sorted(held - wanted - allowed):
            problems.append(f"beyond: {privilege} on {name}")
        for name, privilege in sorted(wanted - held):
            problems.append(f"missing: {privilege} on {name}")

        # column privileges on tables where the table-level privilege is not held
        wanted_columns = {
            (f"{schema()}.{table}", privilege, column)
            for (table, privilege), columns in expected_columns(login).items()
            for column in columns
        }
        cursor.execute(
            "SELECT n.nspname || '.' || c.relname, p.privilege, a.attname"
            " FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p(privilege)"
            " WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND NOT has_table_privilege(%s, c.oid, p.privilege)"
            " AND has_column_privilege(%s, c.oid, a.attnum, p.privilege)",
            [role, role],
        )
        held_columns = set(cursor.fetchall())
        for name, privilege, column in sorted(held_columns - wanted_columns):
            problems.append(f"beyond: {privilege} ({column}) on {name}")
        for name, privilege, column in sorted(wanted_columns - held_columns):
            problems.append(f"missing: {privilege} ({column}) on {name}")

        # SECURITY DEFINER functions run with their owner's rights: only those it needs. A
        # worker may run the partition function of each partitioned target's schema; one that
        # does not exist is no problem (those partitions are deleted in chunks).
        product_functions = [f"{schema()}.{f}" for f in login.functions]
        partition_functions = []
        if "DELETE" in login.targets:
            partition_functions = [
                partition_function(s).as_string(cursor.connection) + "(text, bigint, regclass)"
                for s in sorted({target_schema for target_schema, _ in resolved})
            ]
        cursor.execute(
            "SELECT f, to_regprocedure(f)::oid FROM unnest(%s::text[]) f",
            [product_functions + partition_functions],
        )
        found = dict(cursor.fetchall())
        for signature in product_functions:
            if found[signature] is None:
                problems.append(f"missing: function {signature} (run migrate)")
        wanted_functions = {oid for oid in found.values() if oid is not None}
        cursor.execute(
            "SELECT p.oid, n.nspname || '.' || p.proname || '('"
            " || pg_get_function_identity_arguments(p.oid) || ')', p.prosecdef,"
            " has_function_privilege(%s, p.oid, 'EXECUTE')"
            " FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND (p.prosecdef OR p.oid = ANY(%s))",
            [role, list(wanted_functions)],
        )
        for oid, signature, definer, may_execute in cursor.fetchall():
            if may_execute and definer and oid not in wanted_functions:
                problems.append(f"beyond: EXECUTE on SECURITY DEFINER function {signature}")
            if not may_execute and oid in wanted_functions:
                problems.append(f"missing: EXECUTE on function {signature}")
    return problems


# -- partitions --------------------------------------------------------------------------
#
# Detaching, attaching and dropping a partition are its table owner's. The workers never
# become an owner: a SECURITY DEFINER function owned by the target's owner, in the target's
# schema, does exactly those steps for a run — and checks, inside the database, that the run
# is of the policy's approved version, that its cutoff is no later than that version's
# retention allows now, that the partition belongs to the policy's table, and that every
# value its bounds admit (or, on a table partitioned by key, every row in it) is older than
# the run's cutoff. It records what it detached (database.models.DetachedPartition, which
# only it writes), and attaches or drops only a table it recorded.

PARTITION_FUNCTION = "{schema}_partition"  # in the target's schema, named for the product's

PARTITION_SQL = r"""
CREATE OR REPLACE FUNCTION {function}(op text, run_id bigint, part regclass)
    RETURNS text LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
    target regclass;
    parent regclass;
    bound text;
    upper_bound text;
    key_column text;
    key_type text;
    zone text;
    unit text;
    cutoff_expr text;
    past boolean;
    recorded record;
BEGIN
    SELECT run.id, run.cutoff, v.spec, v.state AS version_state INTO r
    FROM {product}.runs_run run
    JOIN {product}.retention_policyversion v ON v.id = run.policy_version_id
    WHERE run.id = run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'partition function: no run %', run_id USING ERRCODE = '42501';
    END IF;
    target := to_regclass(format('%I.%I', r.spec->>'schema', r.spec->>'table'));
    IF op IN ('read', 'detach', 'finalize', 'attach') THEN
        IF r.version_state <> 'approved' THEN
            RAISE EXCEPTION 'partition function: run % is not of its policy''s approved version',
                run_id USING ERRCODE = '42501';
        END IF;
        IF op <> 'read'
           AND r.cutoff > now() - (r.spec->>'retention')::interval + interval '1 hour' THEN
            RAISE EXCEPTION 'partition function: run %''s cutoff % is later than retention % allows',
                run_id, r.cutoff, r.spec->>'retention' USING ERRCODE = '42501';
        END IF;
    END IF;

    IF op IN ('read', 'detach', 'finalize') THEN
        SELECT i.inhparent INTO parent FROM pg_inherits i WHERE i.inhrelid = part;
        IF target IS NULL OR parent IS DISTINCT FROM target THEN
            RAISE EXCEPTION 'partition function: % is not a partition of the policy''s table %',
                part, target USING ERRCODE = '42501';
        END IF;
        IF op = 'read' THEN  -- the run counts a partition's rows before it may take it whole
            EXECUTE format('GRANT SELECT ON %s TO %I', part, session_user);
            RETURN 'readable';
        END IF;
        bound := pg_get_expr((SELECT relpartbound FROM pg_class WHERE oid = part), part);
        SELECT a.attname, format_type(a.atttypid, NULL) INTO key_column, key_type
        FROM pg_partitioned_table pt
        JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
        WHERE pt.partrelid = target AND pt.partstrat = 'r' AND pt.partnatts = 1;
        -- the cutoff in the timestamp column's own type, as the engine compares rows
        zone := coalesce(nullif(r.spec->>'timestamp_zone', ''), r.spec->>'timezone', 'UTC');
        unit := r.spec->>'timestamp_unit';
        SELECT format_type(a.atttypid, NULL) INTO key_type
        FROM pg_attribute a WHERE a.attrelid = target AND a.attname = r.spec->>'timestamp';
        cutoff_expr := CASE
            WHEN key_type = 'timestamp with time zone' THEN format('%L::timestamptz', r.cutoff)
            WHEN key_type = 'timestamp without time zone'
                THEN format('(%L::timestamptz AT TIME ZONE %L)', r.cutoff, zone)
            WHEN key_type = 'date'
                THEN format('(%L::timestamptz AT TIME ZONE %L)::date', r.cutoff, zone)
            WHEN unit IN ('s', 'ms', 'us') THEN format(
                'floor(extract(epoch FROM %L::timestamptz) * %s)', r.cutoff,
                CASE unit WHEN 's' THEN 1 WHEN 'ms' THEN 1000 ELSE 1000000 END)
        END;
        IF cutoff_expr IS NULL THEN
            RAISE EXCEPTION 'partition function: no cutoff for a % timestamp', key_type
                USING ERRCODE = '42501';
        END IF;
        IF key_column = r.spec->>'timestamp' THEN
            -- partitioned by the timestamp: the upper bound at or before the cutoff
            upper_bound := substring(bound FROM 'TO \((.*)\)$');
            IF upper_bound IS NULL OR upper_bound ILIKE '%MAXVALUE%' THEN
                past := false;
            ELSE
                EXECUTE format('SELECT (%s)::%s <= %s', upper_bound, key_type, cutoff_expr)
                    INTO past;
            END IF;
        ELSE
            -- partitioned otherwise: every row in it older than the cutoff
            EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %s WHERE %I IS NULL OR %I >= %s)',
                part, r.spec->>'timestamp', r.spec->>'timestamp', cutoff_expr) INTO past;
        END IF;
        IF NOT past THEN
            RAISE EXCEPTION 'partition function: % holds values not older than run %''s cutoff %',
                part, run_id, r.cutoff USING ERRCODE = '42501';
        END IF;
        IF op = 'finalize' THEN
            EXECUTE format('ALTER TABLE %s DETACH PARTITION %s FINALIZE', target, part);
        ELSE
            EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', target, part);
        END IF;
        INSERT INTO {product}.database_detachedpartition (relid, run_id, parent, bound, detached_at)
        VALUES (part::oid, run_id, target::text, bound, now())
        ON CONFLICT (relid) DO UPDATE SET run_id = EXCLUDED.run_id, parent = EXCLUDED.parent,
            bound = EXCLUDED.bound, detached_at = EXCLUDED.detached_at;
        -- the run reads it for its census and locks it before the drop
        EXECUTE format('GRANT SELECT, DELETE ON %s TO %I', part, session_user);
        RETURN 'detached';
    END IF;

    SELECT * INTO recorded FROM {product}.database_detachedpartition d WHERE d.relid = part::oid;
    IF NOT FOUND OR recorded.parent <> target::text
       OR EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = part) THEN
        RAISE EXCEPTION 'partition function: % was not detached from % by a run', part, target
            USING ERRCODE = '42501';
    END IF;
    IF op = 'attach' THEN
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s %s', target, part, recorded.bound);
        DELETE FROM {product}.database_detachedpartition WHERE relid = part::oid;
        RETURN 'attached';
    ELSIF op = 'drop' THEN
        EXECUTE format('DROP TABLE %s', part);
        DELETE FROM {product}.database_detachedpartition WHERE relid = part::oid;
        RETURN 'dropped';
    END IF;
    RAISE EXCEPTION 'partition function: unknown step %', op USING ERRCODE = '22023';
END;
$fn$
"""


def partition_function(target_schema: str) -> sql.Composed:
    """The qualified name of the partition function for tables in ``target_schema``."""
    return sql.SQL("{}.{}").format(
        sql.Identifier(target_schema), sql.Identifier(PARTITION_FUNCTION.format(schema=schema()))
    )


def partition_statements(target_schema: str, owner: sql.Composable, worker: sql.Composable):
    """What the target's owner runs (as itself) so the workers can detach, attach and drop
    partitions of its tables in ``target_schema`` through the partition function only."""
    function = partition_function(target_schema)
    return [
        sql.SQL(PARTITION_SQL).format(function=function, product=sql.Identifier(schema())),
        sql.SQL("REVOKE ALL ON FUNCTION {}(text, bigint, regclass) FROM PUBLIC").format(function),
        sql.SQL("GRANT EXECUTE ON FUNCTION {}(text, bigint, regclass) TO {}").format(
            function, worker
        ),
    ]


def owner_grants(owner: sql.Composable) -> list[sql.Composed]:
    """What the product's owner gives a target's owner, so its partition function can read
    the run and its version and keep the record of what it detached."""
    product = sql.Identifier(schema())
    return [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(product, owner),
        sql.SQL("GRANT SELECT ON TABLE {}, {} TO {}").format(
            _qualified("runs_run"), _qualified("retention_policyversion"), owner
        ),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO {}").format(
            _qualified("database_detachedpartition"), owner
        ),
    ]
