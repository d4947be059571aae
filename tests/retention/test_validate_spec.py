from __future__ import annotations

import pytest
from django.db import connection

from retention import actions, introspect
from retention.spec import SpecError, load_toml

from .conftest import policy_toml


def sql(text: str) -> None:
    with connection.cursor() as cur:
        cur.execute(text)


def validate(**overrides):
    return introspect.validate(load_toml(policy_toml(**overrides)))


def test_a_valid_table_validates_with_its_supporting_index(events_table):
    result = validate()
    assert result.supporting_index == "t_events_tenant_id"
    assert result.warnings == []
    assert result.to_json()["column_types"] == {
        "id": "bigint",
        "occurred_at": "timestamp with time zone",
        "tenant_id": "integer",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"key": '"status"'}, "no btree index on public.t_events (tenant_id, status) or (status): a key of type text is planned and deleted along such an index; create one first, or create one leading with 'occurred_at' and set chunking = \"timestamp\""),
        ({"key": '["occurred_at", "id"]'}, "no btree index on public.t_events (tenant_id, occurred_at, id)"),
        ({"key": '["id", "id"]'}, "key lists a column twice: id, id"),
        ({"timestamp": '"id"'}, "timestamp column 'id' of public.t_events is bigint, not a timestamp: if it holds time since the Unix epoch, say so with timestamp_unit = \"s\", \"ms\" or \"us\""),
        ({"timestamp": '"status"'}, "timestamp column 'status' of public.t_events must be timestamptz, timestamp or date, not text (or bigint, integer, numeric, double precision or real with timestamp_unit)"),
        ({"timestamp_unit": '"ms"'}, "timestamp_unit applies to a bigint, integer, numeric, double precision or real timestamp column; 'occurred_at' of public.t_events is timestamp with time zone: leave timestamp_unit out"),
        ({"timestamp": '"tenant_id"', "timestamp_unit": '"ms"'}, "timestamp column 'tenant_id' of public.t_events is integer, which cannot hold a present-day time in timestamp_unit = \"ms\" (it overflows within weeks of 1970); an integer column holds seconds (\"s\")"),
        ({"timestamp": '"id"', "timestamp_unit": '"s"', "timestamp_zone": '"UTC"'}, "timestamp_zone applies to timestamp without time zone and date columns; 'id' of public.t_events counts from the Unix epoch, an instant in UTC"),
        ({"tenant": '"missing"'}, "tenant column 'missing' does not exist in table public.t_events"),
        ({"table": '"other.t_events"'}, "table other.t_events does not exist"),
        ({"tables": '[[keep]]\ncolumn = "occurred_at"\nop = "<"\nvalue = "yesterday-ish"\n'}, "column 'occurred_at'"),
        ({"tables": '[[keep]]\ncolumn = "status"\nop = ">"\nvalue = 5\n'}, "column 'status'"),
    ],
)  # fmt: skip
def test_incompatible_columns_and_values_are_refused_by_name(events_table, overrides, message):
    with pytest.raises(SpecError) as excinfo:
        validate(**overrides)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_a_table_without_a_tenant_key_index_chunks_along_its_key_without_a_false_warning(
    events_table,
):
    sql("DROP INDEX public.t_events_tenant_id")
    # a run takes key-range chunks on the primary key (retention explain shows them): no
    # chunk scans the whole table, and validation no longer says one would
    result = validate()
    assert result.supporting_index == "t_events_pkey"
    assert result.warnings == []
    assert validate(tenant=None).supporting_index == "t_events_pkey"
    # per-tenant chunks pinned without their index do scan it
    pinned = validate(chunking='"tenant"')
    assert pinned.supporting_index is None
    assert pinned.warnings == [
        "no btree index on public.t_events (tenant_id, id): every chunk would scan the whole "
        "table; create one before the first run"
    ]
    sql("ALTER TABLE public.t_events DROP CONSTRAINT t_events_pkey")
    assert validate().warnings == [
        "no btree index on public.t_events (tenant_id, id) or (id): every chunk would scan the "
        "whole table; create one before the first run"
    ]


def test_a_key_without_a_btree_ordering_is_refused_with_one_error(events_table):
    sql("ALTER TABLE public.t_events ADD COLUMN doc json, ADD COLUMN spot point")
    for column, shown in (("doc", "json"), ("spot", "point")):
        with pytest.raises(SpecError) as excinfo:
            validate(key=f'"{column}"')
        assert str(excinfo.value) == (
            f"key column {column!r} of public.t_events has no btree ordering ({shown}): chunks "
            f"are key intervals, so the key must be a type a btree index can order"
        )


def test_keys_of_any_ordered_type_and_composite_keys_validate_on_their_index(events_table):
    sql('ALTER TABLE public.t_events ADD COLUMN ref uuid, ADD COLUMN code text COLLATE "C"')
    sql("CREATE INDEX t_events_at_id ON public.t_events (tenant_id, occurred_at, id)")
    sql("CREATE INDEX t_events_ref ON public.t_events (ref)")
    sql("CREATE INDEX t_events_code ON public.t_events (tenant_id, code)")
    composite = validate(key='["occurred_at", "id"]')
    assert composite.supporting_index == "t_events_at_id"
    assert list(composite.to_json()["column_types"])[:2] == ["occurred_at", "id"]
    assert validate(key='"ref"', tenant=None).supporting_index == "t_events_ref"
    assert validate(key='"code"').supporting_index == "t_events_code"
    # a composite key that holds the tenant column is ordered by it already
    assert validate(key='["tenant_id", "id"]').supporting_index == "t_events_tenant_id"
    # a uuid key with an index of its own takes key-range chunks across tenants on it; pinned
    # per-tenant chunks have no order to plan in without an index leading with (tenant, key)
    assert validate(key='"ref"').supporting_index == "t_events_ref"
    with pytest.raises(SpecError, match=r"no btree index on public.t_events \(tenant_id, ref\):"):
        validate(key='"ref"', chunking='"tenant"')


def test_a_cascading_reference_must_be_acknowledged(events_table, alice):
    sql(
        "CREATE TABLE public.t_event_notes (id int PRIMARY KEY,"
        " event_id bigint REFERENCES public.t_events (id) ON DELETE CASCADE)"
    )
    with pytest.raises(SpecError, match="public.t_event_notes \\(event_id\\) references"):
        actions.apply_spec(load_toml(policy_toml()), author=alice)

    result = validate(cascade_ack='["public.t_event_notes"]')

    assert [(fk.table, fk.on_delete, fk.acknowledged) for fk in result.foreign_keys] == [
        ("public.t_event_notes", "cascade", True)
    ]


def test_a_restricting_reference_is_a_warning_that_chunks_will_fail(events_table):
    sql(
        "CREATE TABLE public.t_event_refs (id int PRIMARY KEY,"
        " event_id bigint REFERENCES public.t_events (id))"
    )
    result = validate(cascade_ack='["public.elsewhere"]')
    assert result.warnings == [
        "public.t_event_refs (event_id) references public.t_events with ON DELETE NO ACTION: "
        "chunks fail while referencing rows exist",
        "cascade_ack lists public.elsewhere, which has no cascading reference to public.t_events",
    ]
    assert result.to_json()["foreign_keys"][0]["on_delete"] == "no action"


def test_a_deferred_foreign_key_is_named_and_said_to_be_checked_at_the_end_of_each_delete(
    events_table,
):
    sql(
        "CREATE TABLE public.t_event_refs (id int PRIMARY KEY, event_id bigint"
        " REFERENCES public.t_events (id) DEFERRABLE INITIALLY DEFERRED)"
    )
    result = validate()
    assert result.warnings[1] == (
        "foreign key t_event_refs_event_id_fkey on public.t_event_refs (event_id) is DEFERRABLE "
        "INITIALLY DEFERRED: PostgreSQL would report its violations only at COMMIT; each chunk's "
        "DELETE leaves the rows it references in place instead (kept: referenced by a row that "
        "stays), and checks it at its end (SET CONSTRAINTS ALL IMMEDIATE) for a reference made "
        "meanwhile"
    )
    assert result.to_json()["foreign_keys"][0]["deferred"] is True


def test_a_cascade_without_an_index_on_its_columns_is_warned_about(events_table):
    sql(
        "CREATE TABLE public.t_event_notes (id int PRIMARY KEY,"
        " event_id bigint REFERENCES public.t_events (id) ON DELETE CASCADE)"
    )
    warning = (
        "foreign key t_event_notes_event_id_fkey on public.t_event_notes (event_id) has no "
        "index leading with its columns: every row a chunk deletes scans public.t_event_notes "
        "for the rows its cascade reaches; create one on public.t_event_notes (event_id)"
    )
    assert warning in validate(cascade_ack='["public.t_event_notes"]').warnings
    sql("CREATE INDEX ON public.t_event_notes (event_id, id)")
    assert warning not in validate(cascade_ack='["public.t_event_notes"]').warnings


def test_cascades_deeper_down_must_be_acknowledged_and_a_cycle_of_them_is_refused(events_table):
    sql(
        "CREATE TABLE public.t_event_notes (id int PRIMARY KEY, back_id int,"
        " event_id bigint REFERENCES public.t_events (id) ON DELETE CASCADE)"
    )
    sql(
        "CREATE TABLE public.t_note_tags (id int PRIMARY KEY,"
        " note_id int REFERENCES public.t_event_notes (id) ON DELETE CASCADE)"
    )
    with pytest.raises(
        SpecError,
        match="foreign key t_note_tags_note_id_fkey on "
        "public.t_note_tags \\(note_id\\) cascades from public.t_event_notes",
    ):
        validate(cascade_ack='["public.t_event_notes"]')
    validate(cascade_ack='["public.t_event_notes", "public.t_note_tags"]')

    sql(
        "ALTER TABLE public.t_event_notes ADD FOREIGN KEY (back_id)"
        " REFERENCES public.t_note_tags (id) ON DELETE CASCADE"
    )
    with pytest.raises(
        SpecError,
        match="foreign key t_event_notes_back_id_fkey on "
        "public.t_event_notes \\(back_id\\) cascades back to",
    ):
        validate(cascade_ack='["public.t_event_notes", "public.t_note_tags"]')


def test_a_view_is_not_a_table(events_table):
    sql("CREATE VIEW public.t_events_view AS SELECT * FROM public.t_events")
    with pytest.raises(SpecError, match="public.t_events_view is not a table"):
        validate(table='"public.t_events_view"')


@pytest.mark.parametrize(
    "table",
    [
        "retention_runner.retention_legalhold",
        "retention_runner.runs_auditrecord",
        "retention_runner.runs_chunk",
        "retention_runner.retention_operatoraction",
        "retention_runner.auth_user",
        "retention_runner.django_session",
        "retention_runner.django_q_schedule",
        "retention_runner.core_cache",
        "retention_runner.django_migrations",
        "pg_catalog.pg_class",
    ],
)
def test_the_products_own_tables_are_never_targets(db, alice, table):
    with pytest.raises(SpecError) as excinfo:
        validate(table=f'"{table}"', timestamp='"placed_at"', tenant=None)
    assert str(excinfo.value) == (
        f"{table} belongs to Retention Runner (schema retention_runner), Django's tables of the "
        "product or PostgreSQL itself; policies may only target application tables"
    )


def test_the_products_tables_are_in_a_schema_of_their_own_and_none_in_public(db):
    from database.schema import product_table_names

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname, count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') GROUP BY 1",
            [product_table_names()],
        )
        where = dict(cursor.fetchall())
    assert where == {"retention_runner": len(product_table_names())}


def test_a_policy_on_the_legal_hold_table_is_refused_and_nothing_is_stored(db, alice):
    from retention.models import LegalHold, Policy, PolicyVersion

    spec = load_toml(
        policy_toml(
            table='"retention_runner.retention_legalhold"', timestamp='"placed_at"', tenant=None
        )
    )
    with pytest.raises(SpecError, match="retention_legalhold belongs to Retention Runner"):
        actions.apply_spec(spec, author=alice)
    assert not Policy.objects.exists()
    assert not PolicyVersion.objects.exists()
    assert LegalHold.objects.count() == 0


def test_chunk_timeouts_that_cannot_fit_the_task_timeout_are_refused_with_every_limit(
    events_table, make_user
):
    from retention.models import Policy

    author = make_user("cora", "compliance")
    spec = load_toml(policy_toml(tables="[timeouts]\nlock_ms = 600000\nstatement_ms = 3600000\n"))
    with pytest.raises(SpecError) as refused:
        actions.apply_spec(spec, author=author)
    message = str(refused.value)
    assert message.startswith("timeouts.statement_ms 3600000 and timeouts.lock_ms 600000")
    for limit in ("RETENTION_Q_TIMEOUT 60 s", "RETENTION_LEASE_BUDGET_S 20 s", "27000 ms"):
        assert limit in message
    assert not Policy.objects.exists()
    # the defaults fit, and so does the largest chunk the limits allow
    validate()
    validate(tables="[timeouts]\nlock_ms = 500\nstatement_ms = 26000\n")
    with pytest.raises(SpecError):
        validate(tables="[timeouts]\nlock_ms = 500\nstatement_ms = 26001\n")


def test_every_cascaded_table_missing_from_cascade_ack_is_named_at_once(events_table):
    """A CRM's message table with four children: one refusal names all four, nothing stored."""
    for name in ("t_att", "t_mentions", "t_reactions", "t_notes"):
        sql(
            f"CREATE TABLE public.{name} (id int PRIMARY KEY,"
            f" event_id bigint REFERENCES public.t_events (id) ON DELETE CASCADE)"
        )
        sql(f"CREATE INDEX ON public.{name} (event_id)")
    with pytest.raises(SpecError) as excinfo:
        validate(cascade_ack='["public.t_notes"]')
    message = str(excinfo.value)
    assert message.startswith(
        "deleting from public.t_events deletes rows of 3 table(s) not listed in cascade_ack: "
    )
    for name in ("public.t_att", "public.t_mentions", "public.t_reactions"):
        assert f"{name} (event_id) references public.t_events with ON DELETE CASCADE" in message
        assert f"'{name}'" in message
    assert "t_notes" not in message and "\n" not in message
    validate(
        cascade_ack='["public.t_notes", "public.t_att", "public.t_mentions", "public.t_reactions"]'
    )


def test_a_set_null_reached_through_a_cascade_is_warned_about_like_a_direct_one(events_table):
    sql(
        "CREATE TABLE public.t_event_notes (id int PRIMARY KEY,"
        " event_id bigint REFERENCES public.t_events (id) ON DELETE CASCADE)"
    )
    sql("CREATE INDEX ON public.t_event_notes (event_id)")
    sql(
        "CREATE TABLE public.t_note_links (id int PRIMARY KEY,"
        " note_id int REFERENCES public.t_event_notes (id) ON DELETE SET NULL)"
    )
    sql(
        "CREATE TABLE public.t_event_links (id int PRIMARY KEY,"
        " event_id bigint REFERENCES public.t_events (id) ON DELETE SET DEFAULT)"
    )
    warnings = validate(cascade_ack='["public.t_event_notes"]').warnings
    assert (
        "public.t_event_links (event_id) references public.t_events with ON DELETE SET DEFAULT: "
        "deleting updates those rows"
    ) in warnings
    assert (
        "public.t_note_links (note_id) references public.t_event_notes, which deleting here "
        "cascades to, with ON DELETE SET NULL: deleting here updates those rows"
    ) in warnings


def test_row_level_security_and_before_delete_triggers_are_warned_about(events_table):
    sql("ALTER TABLE public.t_events ENABLE ROW LEVEL SECURITY")
    sql("ALTER TABLE public.t_events FORCE ROW LEVEL SECURITY")
    sql(
        "CREATE FUNCTION public.t_events_keep() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN IF OLD.status = 'pinned' THEN RETURN NULL; END IF; RETURN OLD; END$$"
    )
    sql(
        "CREATE TRIGGER t_events_keep BEFORE DELETE ON public.t_events"
        " FOR EACH ROW EXECUTE FUNCTION public.t_events_keep()"
    )
    try:
        warnings = validate().warnings
    finally:
        sql("DROP TRIGGER t_events_keep ON public.t_events")
        sql("DROP FUNCTION public.t_events_keep()")
    assert any(
        w.startswith("public.t_events has row-level security (FORCE): the worker login must bypass")
        for w in warnings
    ), warnings
    assert any(
        w.startswith("trigger t_events_keep on public.t_events runs BEFORE DELETE")
        for w in warnings
    ), warnings
