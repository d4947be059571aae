"""The policy's fields are declared once (retention.spec.FIELDS); the parser's keys, the
TOML writer, the diff and the reference in docs/policies.md all follow the declaration."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from retention.diff import flatten
from retention.spec import FIELDS, PolicySpec, SpecError, load_toml, reference_table

from .conftest import policy_toml

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def test_the_reference_in_docs_policies_md_is_the_declared_schema():
    text = DOC.read_text()
    match = re.search(r"<!-- reference:[^\n]*-->\n(.*?)<!-- /reference -->", text, re.S)
    assert match, "docs/policies.md lost its generated reference markers"
    assert match.group(1) == reference_table(), (
        "docs/policies.md's reference differs from retention.spec.FIELDS; "
        "paste retention.spec.reference_table() between the markers"
    )


def test_every_attribute_of_a_spec_is_declared_and_every_declared_key_is_parsed():
    declared = {f.attr for f in FIELDS} | {"schema"}  # "table" fills schema and table
    assert {f.name for f in dataclasses.fields(PolicySpec)} == declared
    spec = load_toml(policy_toml())
    # every declared key with a simple check is refused when out of its declared form
    for f in FIELDS:
        if f.kind == "special":
            continue
        section, key = (f.section, f.key) if f.section else (None, f.path)
        bad = '"?"' if f.kind != "choice" else '"nope"'
        tables = f"[{section}]\n{key} = {bad}\n" if section else ""
        overrides = {} if section else {key: bad}
        with pytest.raises(SpecError, match=re.escape(f.path)):
            load_toml(policy_toml(tables=tables, **overrides))
    assert spec.chunk_size == 500


def test_the_toml_writer_and_the_diff_cover_every_declared_key():
    spec = load_toml(
        policy_toml(
            owner='"ops"',
            timestamp_zone='"UTC"',
            pace_rows_per_s="100",
            partition_action='"detach"',
            detached_keep='"30 days"',
            timestamp_unit='"ms"',
            timestamp_is_expiry="true",
            null_tenant='"delete"',
            chunking='"key"',
            rollout='"slice"',
            slice='"30 days"',
            cascade_ack='["public.b", "public.a"]',
            targets='["payments", "group:shards"]',
            tables='[slo]\nmax_backlog_age = "2 days"\n'
            "[guard]\ninflation_budget = 2.0\ninflation = 2.0\nmargin_ms = 5\nfg_p99_ms = 25\n"
            'signal = "both"\nio_pressure = 0.3\nwal_fsync_ms = 20\n'
            'prometheus_url = "http://prom:9090"\n'
            'prometheus_query = "app_p99_seconds"\nprometheus_threshold = 0.5\n'
            "prometheus_timeout_ms = 500\nprometheus_grace_s = 10\n"
            '[archive]\nto = "file:///srv/archive"\nrestore_days = 9\nkeep_years = 7\n'
            '[[keep]]\ncolumn = "status"\nop = "is null"\n'
            '[[override]]\ntenant = ["7", "8"]\nretention = "7 years"\n'
            '[[class]]\ncolumn = "status"\nvalue = "failed"\nretention = "forever"\n',
        )
    )
    written = tomllib.loads(spec.to_toml())
    for f in FIELDS:
        place = written.get(f.section, {}) if f.section else written
        assert f.key in place, f"{f.path} missing from the written TOML"
    assert load_toml(spec.to_toml()) == spec
    rows = flatten(spec)
    assert {f.path for f in FIELDS if f.path not in ("keep", "override", "class")} <= set(rows)
    assert rows["timestamp_zone"] == "UTC" and rows["keep[0]"] == "status is null"
    assert rows["override[0]"] == "7, 8 → 7 years"
    assert rows["class[0]"] == "status = 'failed' → forever"


def test_detached_keep_is_a_duration_only_with_detach_and_absent_keeps_the_hash():
    plain = load_toml(policy_toml())
    detach = load_toml(policy_toml(partition_action='"detach"'))
    assert "detached_keep" not in detach.to_json() and detach.detached_keep is None
    assert detach.content_hash() == PolicySpec.from_json(detach.to_json()).content_hash()
    kept = load_toml(policy_toml(partition_action='"detach"', detached_keep='" 30  days "'))
    assert kept.detached_keep == "30 days" and kept.detached_keep_delta.days == 30
    assert kept.to_json()["detached_keep"] == "30 days"
    assert PolicySpec.from_json(kept.to_json()) == kept
    assert kept.content_hash() != detach.content_hash() != plain.content_hash()
    with pytest.raises(
        SpecError, match='detached_keep applies only with partition_action = "detach"'
    ):
        load_toml(policy_toml(detached_keep='"30 days"'))
    with pytest.raises(
        SpecError, match='detached_keep applies only with partition_action = "detach"'
    ):
        load_toml(policy_toml(partition_action='"drop"', detached_keep='"30 days"'))
    for bad in ('"-3 days"', '"0 days"', "30", '"soon"'):
        # the field first, after the line it stands on
        with pytest.raises(SpecError, match=r"^line \d+: detached_keep: "):
            load_toml(policy_toml(partition_action='"detach"', detached_keep=bad))
