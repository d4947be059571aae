"""Partitioned tables of shapes the partition step was not designed around: objects that
depend on a partition (a view, a foreign key to the partition itself), row-level DELETE
triggers, a bound equal to the cutoff, a date partition key, quoted names, NULLs in the
default partition. Each run drains and ``check_run`` agrees with the shadow copy; what a
drop would bypass or cannot do leaves the partition to the chunks. docs/engine.md,
"Partitions"."""

from __future__ import annotations

import pytest
from django.db import connection

from retention import actions as retention_actions
from retention import introspect
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import PartitionAction, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count
from tests.runs.processes import pg_connect
from tests.runs.test_partitions import (
    EXPIRED,
    MONTHS,
    create_partitioned,
    drain,
    parts,
    parts_spec,
    relation_exists,
)

pytestmark = [pytest.mark.django_db(transaction=True)]
__all__ = ["parts"]

SHADOW = ("public", "rr_parts_shadow")


def sql(*statements: str) -> None:
    with connection.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def dropped(run: Run) -> list[str]:
    return sorted(
        PartitionAction.objects.filter(run=run, state="dropped").values_list("name", flat=True)
    )


def test_a_view_on_an_expired_partition_leaves_it_to_the_chunks(parts, make_user):
    sql("CREATE VIEW public.rr_parts_jan AS SELECT id FROM public.rr_parts_2026_01")
    try:
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert "rr_parts_2026_01" not in dropped(run)
        assert relation_exists("rr_parts_2026_01")
        assert count("public.rr_parts_jan") == 0  # its rows went in chunks
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP VIEW IF EXISTS public.rr_parts_jan")


def test_a_foreign_key_to_an_expired_partition_leaves_it_to_the_chunks(parts, make_user):
    sql(
        "ALTER TABLE public.rr_parts_2026_02 ADD UNIQUE (id)",
        "CREATE TABLE public.rr_parts_ref (id bigint REFERENCES public.rr_parts_2026_02 (id)"
        " ON DELETE CASCADE)",
    )
    try:
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert "rr_parts_2026_02" not in dropped(run)
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts_ref")


def test_a_delete_trigger_sees_every_deleted_row(parts, make_user):
    sql(
        "CREATE TABLE public.rr_parts_archive (id bigint)",
        "CREATE FUNCTION public.rr_parts_archive() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO public.rr_parts_archive VALUES (OLD.id); RETURN OLD; END$$",
        "CREATE TRIGGER rr_parts_archive AFTER DELETE ON public.rr_parts"
        " FOR EACH ROW EXECUTE FUNCTION public.rr_parts_archive()",
    )
    try:
        before = count("public.rr_parts")
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert count("public.rr_parts_archive") == before - count("public.rr_parts")
        assert dropped(run) == []
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql(
            "DROP TABLE IF EXISTS public.rr_parts_archive",
            "DROP TRIGGER IF EXISTS rr_parts_archive ON public.rr_parts",
            "DROP FUNCTION IF EXISTS public.rr_parts_archive()",
        )


def test_an_upper_bound_equal_to_the_cutoff_is_dropped(parts, make_user):
    # 2026-11-30 12:00 less 2916 hours: 2026-08-01 00:00 UTC, July's upper bound
    spec = events_spec(slug="parts", table="rr_parts", retention="2916 hours", keep=[])
    policy = approved_policy(make_user, **spec)
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert dropped(run) == [f"rr_parts_{m}" for m in EXPIRED]
    assert check_run(run, shadow=SHADOW) == []


def build(ddl: list[str], table: str, rows_sql: str, *, index: str = "(tenant_id, id)") -> None:
    """Run ``ddl`` (dropping what it creates first is the caller's), fill ``table`` (a quoted
    qualified name) with ``rows_sql``, index it, and copy it to public.rr_parts_shadow."""
    sql("DROP TABLE IF EXISTS public.rr_parts_shadow", *ddl, f"INSERT INTO {table} {rows_sql}")
    sql(f"CREATE INDEX ON {table} {index}", f"CREATE TABLE public.rr_parts_shadow AS SELECT * FROM {table}",
        f"ANALYZE {table}")  # fmt: skip


MONTHLY = """SELECT g, 1 + g % 4, timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour'),
                    'closed', 'x' FROM generate_series(1, 7000) g"""


def run_policy(make_user, **overrides) -> Run:
    spec = events_spec(slug="parts", table="rr_parts", retention="120 days", keep=[])
    spec.update(overrides)
    policy = approved_policy(make_user, **spec)
    run, _ = trigger_run(policy, tick=NOW)
    return drain(run)


def test_quoted_schema_and_partition_names(transactional_db, settings, make_user):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = '"OpsData"."Events"'
    build(
        [
            'DROP SCHEMA IF EXISTS "OpsData" CASCADE',
            'CREATE SCHEMA "OpsData"',
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text)"
            " PARTITION BY RANGE (occurred_at)",
            f'CREATE TABLE "OpsData"."Events 2026-01" PARTITION OF {t}'
            " FOR VALUES FROM (MINVALUE) TO ('2026-02-01 00:00+00')",
            f'CREATE TABLE "OpsData"."Events 2026-02..05" PARTITION OF {t}'
            " FOR VALUES FROM ('2026-02-01 00:00+00') TO ('2026-06-01 00:00+00')",
            f'CREATE TABLE "OpsData"."Events later" PARTITION OF {t}'
            " FOR VALUES FROM ('2026-06-01 00:00+00') TO (MAXVALUE)",
        ],
        t,
        MONTHLY,
    )
    try:
        run = run_policy(make_user, table="OpsData.Events")
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == ["Events 2026-01", "Events 2026-02..05"]
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql(
            'DROP SCHEMA IF EXISTS "OpsData" CASCADE', "DROP TABLE IF EXISTS public.rr_parts_shadow"
        )


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_a_date_partition_key_in_a_zone_far_from_utc(transactional_db, settings, make_user, zone):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at date NOT NULL, status text, payload text) PARTITION BY RANGE (occurred_at)",
            *[
                f"CREATE TABLE public.rr_parts_d{d} PARTITION OF {t} FOR VALUES FROM"
                f" ('2026-07-{d:02d}') TO ('2026-07-{d + 1:02d}')"
                for d in range(28, 31)
            ],
            f"CREATE TABLE public.rr_parts_old PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ('2026-07-28')",
            f"CREATE TABLE public.rr_parts_new PARTITION OF {t} FOR VALUES FROM ('2026-07-31') TO (MAXVALUE)",
        ],
        t,
        """SELECT g, 1 + g % 4, date '2026-07-20' + (g % 20), 'closed', 'x'
           FROM generate_series(1, 2000) g""",
    )
    try:
        # cutoff 2026-11-30 12:00 UTC less 123 days: 2026-07-30 12:00 UTC, which is
        # 2026-07-31 02:00 in Kiritimati (+14) and 2026-07-30 01:00 in Pago Pago (-11)
        run = run_policy(make_user, retention="123 days", timezone=zone, timestamp_zone=zone)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert check_run(run, shadow=SHADOW) == []
        expected = ["rr_parts_d28", "rr_parts_d29", "rr_parts_old"]
        if zone == "Pacific/Kiritimati":
            expected = ["rr_parts_d28", "rr_parts_d29", "rr_parts_d30", "rr_parts_old"]
        assert dropped(run) == expected
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_null_timestamps_and_old_rows_in_the_default_partition(
    transactional_db, settings, make_user
):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int, occurred_at timestamptz,"
            " status text, payload text) PARTITION BY RANGE (occurred_at)",
            f"CREATE TABLE public.rr_parts_h1 PARTITION OF {t} FOR VALUES FROM"
            " ('2026-03-01 00:00+00') TO ('2026-06-01 00:00+00')",
            f"CREATE TABLE public.rr_parts_h2 PARTITION OF {t} FOR VALUES FROM"
            " ('2026-06-01 00:00+00') TO ('2027-01-01 00:00+00')",
            f"CREATE TABLE public.rr_parts_default PARTITION OF {t} DEFAULT",
        ],
        t,
        """SELECT g, CASE WHEN g % 50 = 0 THEN NULL ELSE 1 + g % 4 END,
                  CASE WHEN g % 37 = 0 THEN NULL
                       ELSE timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour') END,
                  'closed', 'x' FROM generate_series(1, 7000) g""",
    )
    try:
        run = run_policy(make_user)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == []  # h1 has NULL tenants, the default partition never goes
        assert count(t, "occurred_at IS NULL") == count(
            "public.rr_parts_shadow", "occurred_at IS NULL"
        )
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


@pytest.mark.parametrize(
    "how", ["LIST (tenant_id)", "HASH (id)", "RANGE (tenant_id)", "RANGE (occurred_at, id)"]
)
def test_other_partitionings_go_in_chunks(transactional_db, settings, make_user, how):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    kind = how.split()[0]
    if kind == "LIST":
        parts_ddl = [
            f"CREATE TABLE public.rr_parts_{i} PARTITION OF {t} FOR VALUES IN ({i})"
            for i in range(1, 5)
        ]
    elif kind == "HASH":
        parts_ddl = [
            f"CREATE TABLE public.rr_parts_{i} PARTITION OF {t} FOR VALUES WITH (MODULUS 3, REMAINDER {i})"
            for i in range(3)
        ]
    elif "," in how:
        parts_ddl = [f"CREATE TABLE public.rr_parts_a PARTITION OF {t} FOR VALUES FROM (MINVALUE, MINVALUE) TO ('2026-06-01 00:00+00', 0)",
                     f"CREATE TABLE public.rr_parts_b PARTITION OF {t} FOR VALUES FROM ('2026-06-01 00:00+00', 0) TO (MAXVALUE, MAXVALUE)"]  # fmt: skip
    else:
        parts_ddl = [f"CREATE TABLE public.rr_parts_lo PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO (3)",
                     f"CREATE TABLE public.rr_parts_hi PARTITION OF {t} FOR VALUES FROM (3) TO (MAXVALUE)"]  # fmt: skip
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            f" occurred_at timestamptz NOT NULL, status text, payload text) PARTITION BY {how}",
            *parts_ddl,
        ],
        t,
        MONTHLY,
    )
    try:
        run = run_policy(make_user)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == []
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


@pytest.mark.parametrize("tenant_type", ["citext", "varchar(10)", "bigint"])
def test_a_held_tenant_in_an_expired_partition_of_another_type(
    transactional_db, settings, make_user, tenant_type
):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    value = (
        "1 + g % 4"
        if tenant_type == "bigint"
        else "(ARRAY['Acme', 'globex', 'ACME ', 'initech'])[1 + g % 4]"
    )
    sql("CREATE EXTENSION IF NOT EXISTS citext")
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id {tenant_type} NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text) PARTITION BY RANGE (occurred_at)",
            f"CREATE TABLE public.rr_parts_a PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ('2026-04-01 00:00+00')",
            f"CREATE TABLE public.rr_parts_b PARTITION OF {t} FOR VALUES FROM ('2026-04-01 00:00+00') TO (MAXVALUE)",
        ],
        t,
        f"SELECT g, {value}, timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour'), 'closed', 'x'"
        " FROM generate_series(1, 7000) g",
    )
    try:
        spec = events_spec(slug="parts", table="rr_parts", retention="120 days", keep=[])
        policy = approved_policy(make_user, **spec)
        held = (
            "acme"
            if tenant_type == "citext"
            else ("ACME " if tenant_type.startswith("varchar") else "03")
        )
        where = {"citext": "tenant_id = 'acme'", "bigint": "tenant_id = 3"}.get(
            tenant_type, "tenant_id = 'ACME '"
        )
        before = count("public.rr_parts_a", where)
        assert before > 0
        retention_actions.place_hold(
            actor=make_user("kim", "compliance"), reason="court", policy=policy, tenant=held
        )
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == []
        assert count("public.rr_parts_a", where) == before
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_a_cascading_foreign_key_to_the_partitioned_table(parts, make_user):
    sql(
        "ALTER TABLE public.rr_parts ADD PRIMARY KEY (id, occurred_at)",
        "CREATE TABLE public.rr_parts_ref (id bigint, at timestamptz,"
        " FOREIGN KEY (id, at) REFERENCES public.rr_parts ON DELETE CASCADE)",
        "INSERT INTO public.rr_parts_ref SELECT id, occurred_at FROM public.rr_parts WHERE id % 500 = 1",
    )
    try:
        referenced = count("public.rr_parts_ref")
        policy = approved_policy(make_user, **parts_spec(cascade_ack=["public.rr_parts_ref"]))
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        # referencing rows went with the rows they reference, by the cascade, never orphaned
        assert (
            count(
                "public.rr_parts_ref r",
                "NOT EXISTS (SELECT 1 FROM public.rr_parts p WHERE p.id = r.id)",
            )
            == 0
        )
        assert count("public.rr_parts_ref") < referenced
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts_ref")


def test_keys_not_following_time_and_a_key_range_hold(transactional_db, settings, make_user):
    """Timestamp partitions whose ids are shuffled: a dropped partition's [min, max] key
    interval overlaps rows of every other partition, and a key-range hold picks rows of
    several partitions."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text) PARTITION BY RANGE (occurred_at)",
            *[
                f"CREATE TABLE public.rr_parts_q{q} PARTITION OF {t} FOR VALUES FROM"
                f" ('2026-{3 * q + 1:02d}-01 00:00+00') TO ('{2027 if q == 3 else 2026}-{(3 * q + 3) % 12 + 1:02d}-01 00:00+00')"
                for q in range(4)
            ],
        ],
        t,
        """SELECT (g * 7919) % 8009, 1 + g % 4, timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour'),
                  'closed', 'x' FROM generate_series(1, 8000) g""",
    )
    try:
        spec = events_spec(slug="parts", table="rr_parts", retention="120 days", keep=[])
        policy = approved_policy(make_user, **spec)
        held = count("public.rr_parts_q1", "id >= 100 AND id < 140")
        assert held > 0
        retention_actions.place_hold(actor=make_user("kim", "compliance"), reason="court", policy=policy,
                                     key_from=100, key_to=140)  # fmt: skip
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == ["rr_parts_q0"]  # q1 holds held keys, q2 straddles
        assert count("public.rr_parts_q1", "id >= 100 AND id < 140") == held
        assert count(t, "id >= 100 AND id < 140") == count(
            "public.rr_parts_shadow", "id >= 100 AND id < 140 AND occurred_at >= '2026-04-01'"
        )
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_partitioned_on_the_key_with_open_ends(transactional_db, settings, make_user):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text) PARTITION BY RANGE (id)",
            f"CREATE TABLE public.rr_parts_k0 PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO (0)",
            f"CREATE TABLE public.rr_parts_k1 PARTITION OF {t} FOR VALUES FROM (0) TO (2000)",
            f"CREATE TABLE public.rr_parts_k2 PARTITION OF {t} FOR VALUES FROM (2000) TO (4000)",
            f"CREATE TABLE public.rr_parts_k3 PARTITION OF {t} FOR VALUES FROM (4000) TO (MAXVALUE)",
        ],
        t,
        """SELECT g - 3000, 1 + g % 4, timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour'),
                  'closed', 'x' FROM generate_series(1, 8000) g""",
    )
    try:
        run = run_policy(make_user)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == ["rr_parts_k0", "rr_parts_k1"]
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_a_null_timestamp_in_an_expired_partition_of_a_table_partitioned_on_its_key_stays(
    transactional_db, settings, make_user
):
    """Partitioned on its key, with a nullable timestamp: a row with a NULL timestamp in a
    partition every other row of which is expired is not eligible (its age is unknown), so
    its partition is not dropped whole — the chunks delete the rest around it. The partition
    without such a row goes whole."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz, status text, payload text) PARTITION BY RANGE (id)",
            f"CREATE TABLE public.rr_parts_k1 PARTITION OF {t} FOR VALUES FROM (0) TO (2000)",
            f"CREATE TABLE public.rr_parts_k2 PARTITION OF {t} FOR VALUES FROM (2000) TO (4000)",
            f"CREATE TABLE public.rr_parts_k3 PARTITION OF {t} FOR VALUES FROM (4000) TO (MAXVALUE)",
        ],
        t,
        """SELECT g, 1 + g % 4, CASE WHEN g = 1234 THEN NULL
                  ELSE timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour') END,
                  'closed', 'x' FROM generate_series(1, 8000) g""",
    )
    try:
        run = run_policy(make_user)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == ["rr_parts_k2"]
        assert count(t, "id = 1234 AND occurred_at IS NULL") == 1
        assert count("public.rr_parts_k1") == 1  # the rest of k1 went in chunks
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


@pytest.mark.parametrize("default", [False, True])
def test_a_foreground_transaction_reading_an_expired_partition(
    transactional_db, settings, make_user, default
):
    """A foreground transaction holds a snapshot (and its lock) on an expired partition while
    the run reaches it: the detach waits no longer than the lock timeout, the run goes on
    once the transaction ends, and nothing is lost or left half-detached."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned(default=default)
    fg = pg_connect(autocommit=False)
    try:
        fg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        before = fg.execute("SELECT count(*) FROM public.rr_parts_2026_02").fetchone()[0]
        policy = approved_policy(make_user, **parts_spec(keep=[], timeouts={"lock_ms": 200}))
        run, _ = trigger_run(policy, tick=NOW)
        worker.drain(run.pk, budget_s=3)
        run.refresh_from_db()
        # the foreground transaction still reads the rows it read
        assert fg.execute("SELECT count(*) FROM public.rr_parts_2026_02").fetchone()[0] == before
        fg.rollback()
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        # a concurrent detach waits (pending) and is finished first, before the next one; a
        # plain detach (beside a default partition) gave up at the lock timeout and is tried
        # again once the transaction ended (before, it was left to the chunks for good)
        assert dropped(run) == [f"rr_parts_{m}" for m in EXPIRED]
        assert PartitionAction.objects.filter(run=run, state="detaching").count() == 0
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_inherits WHERE inhdetachpending")
            assert cur.fetchone()[0] == 0
        assert check_run(run, shadow=SHADOW) == []
    finally:
        fg.close()
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            sql(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


@pytest.mark.parametrize("root", [False, True])
def test_a_published_table_replicates_its_deletes(parts, make_user, root):
    """Logical replication sends a subscriber the rows a DELETE removes; a dropped partition
    reaches no subscriber, which would keep every row of it. A table published with its
    deletes goes in chunks."""
    via = " WITH (publish_via_partition_root = true)" if root else ""
    sql(
        "ALTER TABLE public.rr_parts ADD PRIMARY KEY (id, occurred_at)",  # its replica identity
        "DROP PUBLICATION IF EXISTS rr_parts_pub",
        f"CREATE PUBLICATION rr_parts_pub FOR TABLE public.rr_parts{via}",
    )
    try:
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == []
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP PUBLICATION IF EXISTS rr_parts_pub")


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_published_table_without_replica_identity_is_refused(parts, make_user, partitioned):
    """PostgreSQL refuses every DELETE on a table that publishes deletes and has no replica
    identity: validation says so once, instead of a run whose every chunk dead-letters."""
    target = "public.rr_parts" if partitioned else "public.rr_parts_shadow"
    sql(
        "DROP PUBLICATION IF EXISTS rr_parts_pub",
        f"CREATE PUBLICATION rr_parts_pub FOR TABLE {target}",
    )
    try:
        spec = parts_spec() if partitioned else events_spec(slug="parts", table="rr_parts_shadow")
        with pytest.raises(SpecError, match="replica identity"):
            introspect.validate(PolicySpec.parse(spec))
        sql(f"ALTER TABLE {target} REPLICA IDENTITY FULL")
        if partitioned:
            for month in MONTHS:
                sql(f"ALTER TABLE public.rr_parts_{month} REPLICA IDENTITY FULL")
        introspect.validate(PolicySpec.parse(spec))
    finally:
        sql("DROP PUBLICATION IF EXISTS rr_parts_pub")


@pytest.mark.parametrize("key", ["uuid", "composite"])
def test_a_partitioned_table_with_a_key_that_is_not_one_integer(
    transactional_db, settings, make_user, key
):
    """Partitions go whole only for one integer key; with a uuid or a composite key every row
    goes in chunks over the parent, along its partitioned index."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    t = "public.rr_parts"
    id_sql = "uuid NOT NULL" if key == "uuid" else "bigint NOT NULL"
    id_val = "md5(g::text)::uuid" if key == "uuid" else "g % 50"
    build(
        [
            "DROP TABLE IF EXISTS public.rr_parts CASCADE",
            f"CREATE TABLE {t} (id {id_sql}, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text) PARTITION BY RANGE (occurred_at)",
            f"CREATE TABLE public.rr_parts_a PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ('2026-05-01 00:00+00')",
            f"CREATE TABLE public.rr_parts_b PARTITION OF {t} FOR VALUES FROM ('2026-05-01 00:00+00') TO (MAXVALUE)",
        ],
        t,
        f"SELECT {id_val}, 1 + g % 4, timestamptz '2026-01-01 00:00+00' + (g * interval '1 hour'), 'closed', 'x'"
        " FROM generate_series(1, 7000) g",
        index="(tenant_id, id)" if key == "uuid" else "(tenant_id, occurred_at, id)",
    )
    try:
        overrides = {} if key == "uuid" else {"key": ["occurred_at", "id"]}
        run = run_policy(make_user, **overrides)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert dropped(run) == []
        assert count("public.rr_parts_a") == 0
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
