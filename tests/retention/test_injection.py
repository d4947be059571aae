"""Nothing a policy author types can change the shape of the SQL: identifiers are refused
by the parser (and quoted with ``sql.Identifier`` anyway); values are bound parameters."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.db import connection

from retention import actions, predicate
from retention.models import LegalHold
from retention.preview import preview
from retention.spec import SpecError, load_toml

from .conftest import EVENTS_ROWS, count_rows, policy_toml

HOSTILE = [
    "x; DROP TABLE t_events",
    "t_events; DROP TABLE t_events; --",
    'id"; --',
    "id' OR '1'='1",
    'x"y',
    "ïd",
    "ｉｄ",  # fullwidth letters
    "id\u200b",  # zero-width space
    "id -- comment",
    "",
]

IDENTIFIER_FIELDS = ["table", "key", "timestamp", "tenant"]


def tables_exist() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('public.t_events') IS NOT NULL")
        return cur.fetchone()[0]


def toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\u200b", "\\u200b")
    return f'"{escaped}"'


@pytest.mark.parametrize("field", IDENTIFIER_FIELDS + ["keep column", "schema"])
@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_identifier_is_refused_by_the_parser(field, hostile, events_table):
    if field == "keep column":
        text = policy_toml(tables=f'[[keep]]\ncolumn = {toml_string(hostile)}\nop = "is null"\n')
    elif field == "schema":
        text = policy_toml(table=toml_string(f"{hostile}.t_events"))
    else:
        text = policy_toml(**{field: toml_string(hostile)})

    with pytest.raises(SpecError):
        load_toml(text)

    assert tables_exist()
    assert count_rows() == EVENTS_ROWS


def test_identifiers_are_quoted_even_when_they_would_pass(events_table):
    spec = load_toml(policy_toml())
    frag = predicate.delete_chunk(
        spec, policy_id=1, cutoff=datetime(2020, 1, 1), tenant="1", key_from=0, key_to=10
    )
    text = frag.sql.as_string(connection.connection)
    assert 'DELETE FROM "public"."t_events" AS "t"' in text
    assert '"t"."occurred_at" < %s' in text


HOSTILE_VALUES = [
    "x'; DROP TABLE t_events; --",
    "O'Brien\"; --",
    "naïve ☃ \u00e9\u0301",
    "%s %(x)s {}",
    "\\'; SELECT pg_sleep(10); --",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_a_hostile_keep_value_is_bound_and_matches_literally(value, events_table, alice):
    with connection.cursor() as cur:
        cur.execute("UPDATE public.t_events SET status = 'closed' WHERE status IS NULL")
        cur.execute("UPDATE public.t_events SET status = %s WHERE id %% 10 = 0", [value])
    marked = count_rows("status = %s", [value])
    assert marked == EVENTS_ROWS // 10
    text = policy_toml(
        tables=f'[[keep]]\ncolumn = "status"\nop = "="\nvalue = {toml_string(value)}\n'
    )
    spec = load_toml(text)
    assert spec.keep[0].value == value
    version = actions.submit_version(
        actions.apply_spec(spec, author=alice), actor=alice, reason="ready for review"
    )
    result = version.preview
    cutoff = datetime.fromisoformat(result["cutoff"])
    marked_old = count_rows("status = %s AND occurred_at < %s", [value, cutoff])

    frag = predicate.delete_chunk(
        spec,
        policy_id=version.policy_id,
        cutoff=cutoff,
        tenant=None,
        key_from=0,
        key_to=10**9,
    )
    with connection.cursor() as cur:
        cur.execute(frag.sql, frag.params)
        deleted = cur.rowcount

    assert tables_exist()
    assert result["kept_by_rule"][0]["rows"] == marked_old
    assert deleted == result["eligible"]
    assert count_rows("status = %s", [value]) == marked  # every marked row kept, old or new
    assert count_rows("occurred_at < %s", [cutoff]) == result["kept"]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_a_hostile_hold_tenant_is_bound_and_matches_nothing_else(value, events_table, alice):
    # a text tenant column can hold any value: the hold is stored as data and matches nothing
    spec = load_toml(policy_toml(tenant='"status"'))
    policy = actions.apply_spec(spec, author=alice).policy
    hold = actions.place_hold(actor=alice, reason="odd tenant", policy=policy, tenant=value)
    before = preview(spec, policy_id=policy.pk)

    assert hold.tenant == value
    assert before["held"] == 0  # no tenant has that name; the hold is data, not SQL
    null_tenant = before["not_eligible_null"]["tenant"]  # status is NULL in some rows
    assert before["eligible"] + null_tenant == before["older_than_cutoff"]
    assert tables_exist()

    # an integer tenant column cannot hold it: one line, naming the value, nothing stored
    numbers = actions.apply_spec(load_toml(policy_toml(slug='"events-int"')), author=alice).policy
    with pytest.raises(actions.ActionError, match="is not a value of policy events-int"):
        actions.place_hold(actor=alice, reason="odd tenant", policy=numbers, tenant=value)
    assert LegalHold.objects.count() == 1
    assert tables_exist()


def test_a_keep_value_with_quotes_against_a_number_column_is_refused_naming_the_column(
    events_table, alice
):
    spec = load_toml(
        policy_toml(tables='[[keep]]\ncolumn = "tenant_id"\nop = "="\nvalue = "1\' OR \'1\'=\'1"\n')
    )
    with pytest.raises(SpecError, match="column 'tenant_id'"):
        actions.apply_spec(spec, author=alice)
    assert tables_exist()
