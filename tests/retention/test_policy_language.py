"""What a policy file can say about time and tenants: epoch units, calendar and zero retention,
boolean keep values, tenants of several columns and an explicit choice for rows without a
tenant. Each new key is declared once (``retention.spec.FIELDS``) and left out of the stored
document at its default, so the content hash of every older version stays what it was."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from retention.spec import PolicySpec, SpecError, load_toml

from .conftest import policy_toml


def unplaced(error) -> str:
    """A policy file's error without the line it names (every such error names one)."""
    text = str(error)
    assert re.match(r"^line \d+: ", text), text
    return re.sub(r"^line \d+: ", "", text)


def test_the_new_keys_at_their_defaults_leave_the_stored_document_and_its_hash_unchanged():
    plain = load_toml(policy_toml())
    stored = plain.to_json()
    for absent in ("timestamp_unit", "timestamp_is_expiry", "null_tenant"):
        assert absent not in stored
    spelled_out = load_toml(
        policy_toml(null_tenant='"keep"', timestamp_is_expiry="false", tenant='["tenant_id"]')
    )
    assert spelled_out.content_hash() == plain.content_hash()
    assert PolicySpec.from_json(stored).content_hash() == plain.content_hash()
    assert spelled_out.tenant == "tenant_id"


def test_an_epoch_unit_is_one_of_s_ms_us_and_is_part_of_the_hash():
    plain = load_toml(policy_toml())
    for unit in ("s", "ms", "us"):
        spec = load_toml(policy_toml(timestamp_unit=f'"{unit}"'))
        assert spec.timestamp_unit == unit
        assert spec.to_json()["timestamp_unit"] == unit
        assert spec.content_hash() != plain.content_hash()
        assert load_toml(spec.to_toml()) == spec
    with pytest.raises(
        SpecError, match=r"^line \d+: timestamp_unit must be one of s, ms, us, got 'sec'$"
    ):
        load_toml(policy_toml(timestamp_unit='"sec"'))


@pytest.mark.parametrize(
    ("retention", "tick", "cutoff"),
    [
        # months and years on the policy's wall clock; a day the earlier month lacks is its last
        ("6 months", datetime(2026, 8, 31, 3, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2026, 2, 28, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
        ("1 month", datetime(2026, 3, 31, 3, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2026, 2, 28, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
        # across the spring change: the same wall-clock time, 23 hours fewer than 30 days' worth
        ("1 month", datetime(2026, 4, 15, 3, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2026, 3, 15, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
        ("1 year", datetime(2028, 2, 29, 3, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2027, 2, 28, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
        ("2 years", datetime(2026, 11, 30, 3, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2024, 11, 30, 3, tzinfo=ZoneInfo("Europe/Berlin"))),
    ],
)  # fmt: skip
def test_months_and_years_are_calendar_units_in_the_policys_zone(retention, tick, cutoff):
    spec = load_toml(policy_toml(retention=f'"{retention}"'))
    assert spec.cutoff_for(tick.astimezone(UTC)) == cutoff.astimezone(UTC)


def test_zero_retention_is_refused_with_the_way_forward_unless_the_timestamp_is_an_expiry():
    with pytest.raises(SpecError) as refused:
        load_toml(policy_toml(retention='"0 days"'))
    assert unplaced(refused.value) == (
        "retention must be longer than zero, got '0 days'; when the timestamp is an expiry "
        "time (a row may go once it has passed), set timestamp_is_expiry = true"
    )
    spec = load_toml(policy_toml(retention='"0 days"', timestamp_is_expiry="true"))
    tick = datetime(2026, 11, 30, 2, tzinfo=UTC)
    assert spec.cutoff_for(tick) == tick
    assert spec.to_json()["timestamp_is_expiry"] is True
    assert load_toml(spec.to_toml()) == spec
    # an expiry with a grace period is a retention after the expiry
    grace = load_toml(policy_toml(retention='"2 hours"', timestamp_is_expiry="true"))
    assert grace.cutoff_for(tick) == datetime(2026, 11, 30, 0, tzinfo=UTC)
    with pytest.raises(
        SpecError, match=r"^line \d+: timestamp_is_expiry must be true or false, got 'yes'$"
    ):
        load_toml(policy_toml(timestamp_is_expiry='"yes"'))


def test_a_boolean_keep_value_is_accepted_and_hashed_as_a_boolean():
    spec = load_toml(policy_toml(tables='[[keep]]\ncolumn = "pinned"\nop = "="\nvalue = true\n'))
    assert spec.keep[0].value is True
    assert spec.keep[0].describe() == "pinned = true"
    assert spec.to_json()["keep"] == [{"column": "pinned", "op": "=", "value": True}]
    assert load_toml(spec.to_toml()) == spec
    listed = load_toml(
        policy_toml(tables='[[keep]]\ncolumn = "pinned"\nop = "in"\nvalues = [true]\n')
    )
    assert listed.keep[0].values == (True,)


def test_a_tenant_of_several_columns_is_a_list_of_distinct_columns():
    spec = load_toml(policy_toml(tenant='["entity_type", "entity_id"]'))
    assert spec.tenant == ("entity_type", "entity_id")
    assert spec.tenant_columns == ("entity_type", "entity_id")
    assert spec.tenant_label == "(entity_type, entity_id)"
    assert spec.to_json()["tenant"] == ["entity_type", "entity_id"]
    assert PolicySpec.from_json(spec.to_json()) == spec
    assert load_toml(spec.to_toml()) == spec
    assert load_toml(policy_toml()).tenant_columns == ("tenant_id",)
    assert load_toml(policy_toml(tenant=None)).tenant_columns == ()
    for bad, message in (
        ('["a", "a"]', "tenant lists a column twice: a, a"),
        ("[]", "tenant must list 1 to 4 columns, got 0"),
        ('["a", "b c"]', "tenant[1] must be a plain SQL identifier"),
    ):
        with pytest.raises(SpecError, match=rf"^line \d+: {re.escape(message)}"):
            load_toml(policy_toml(tenant=bad))


def test_rows_without_a_tenant_are_kept_unless_the_policy_says_delete():
    assert load_toml(policy_toml()).null_tenant == "keep"
    spec = load_toml(policy_toml(null_tenant='"delete"'))
    assert spec.null_tenant == "delete" and spec.to_json()["null_tenant"] == "delete"
    with pytest.raises(
        SpecError, match=r"^line \d+: null_tenant applies to a policy with a tenant"
    ):
        load_toml(policy_toml(tenant=None, null_tenant='"delete"'))
    with pytest.raises(SpecError) as refused:
        load_toml(policy_toml(null_tenant='"delete"', chunking='"tenant"'))
    assert unplaced(refused.value) == (
        'null_tenant = "delete" cannot go with chunking = "tenant": rows without a tenant '
        'belong to no tenant\'s chunks; use chunking = "key", "timestamp" or "auto"'
    )
    with pytest.raises(SpecError, match=r"^line \d+: null_tenant must be one of keep, delete"):
        load_toml(policy_toml(null_tenant='"drop"'))
