from __future__ import annotations

import pytest

from retention.diff import spec_diff
from retention.spec import SpecError, load_toml

from .conftest import policy_toml

RULES = """
[limits]
policy_workers = 4
tenant_workers = 2

[guard]
probe_p95_ms = 40

[[keep]]
column = "status"
op = "not in"
values = ["a\\"b", "ünï", "x'; --"]

[[keep]]
column = "tenant_id"
op = "is null"
"""


def test_a_spec_written_back_as_toml_parses_to_the_same_spec_and_hash():
    spec = load_toml(
        policy_toml(
            owner='"data \\"platform\\""',
            cascade_ack='["a.b"]',
            pace_rows_per_s="20000",
            tables=RULES,
        )
    )

    again = load_toml(spec.to_toml())

    assert again == spec
    assert again.content_hash() == spec.content_hash()


def test_an_empty_file_is_refused_in_one_line():
    with pytest.raises(SpecError, match="the policy file is empty"):
        load_toml("   \n")


def test_the_diff_names_each_changed_field_against_the_approved_spec():
    old = load_toml(policy_toml())
    new = load_toml(policy_toml(retention='"60 days"', chunk_size="1000", tables=RULES))

    changed = {
        row["field"]: (row["old"], row["new"]) for row in spec_diff(old, new) if row["changed"]
    }

    assert changed == {
        "retention": ("30 days", "60 days"),
        "chunk_size": ("500", "1000"),
        "limits.policy_workers": ("2", "4"),
        "limits.tenant_workers": ("1", "2"),
        "guard.probe_p95_ms": ("25.0", "40.0"),
        "keep[0]": (None, "status not in ('a\"b', 'ünï', \"x'; --\")"),
        "keep[1]": (None, "tenant_id is null"),
    }


def test_without_an_approved_version_every_field_is_new_and_none_is_marked_changed():
    rows = spec_diff(None, load_toml(policy_toml()))
    assert rows and all(row["old"] is None and not row["changed"] for row in rows)
    assert {"field": "table", "old": None, "new": "public.t_events", "changed": False} in rows
