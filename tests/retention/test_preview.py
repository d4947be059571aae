from __future__ import annotations

import io
import json
from datetime import UTC, datetime

from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from retention import actions, predicate
from retention.models import Policy
from retention.preview import ASSUMED_ROWS_PER_SECOND, preview
from retention.schedule_math import latest_tick
from retention.spec import load_toml

from .conftest import count_rows, policy_toml

KEEP_LEGAL = '[[keep]]\ncolumn = "status"\nop = "="\nvalue = "legal"\n'


def applied(author, **overrides):
    spec = load_toml(policy_toml(**overrides))
    version = actions.apply_spec(spec, author=author)
    return spec, version.policy


def delete_everything_eligible(spec, policy, cutoff, tenant=None) -> int:
    """What the run's DELETE removes over the whole key range (one chunk from 0 to max+1)."""
    frag = predicate.delete_chunk(
        spec, policy_id=policy.pk, cutoff=cutoff, tenant=tenant, key_from=0, key_to=10**9
    )
    with connection.cursor() as cur:
        cur.execute(frag.sql, frag.params)
        return cur.rowcount


def test_the_preview_counts_exactly_what_the_delete_then_deletes(events_table, alice):
    spec, policy = applied(alice, tables=KEEP_LEGAL)
    actions.place_hold(actor=alice, reason="litigation 42", policy=policy, tenant="2")
    result = preview(spec, policy_id=policy.pk)
    cutoff = datetime.fromisoformat(result["cutoff"])
    older = count_rows("occurred_at < %s", [cutoff])
    assert result["older_than_cutoff"] == older
    assert 0 < result["eligible"] < older

    deleted_per_tenant = {
        str(t): delete_everything_eligible(spec, policy, cutoff, tenant=str(t)) for t in range(1, 6)
    }

    assert sum(deleted_per_tenant.values()) == result["eligible"]
    assert {t["tenant"]: t["eligible"] for t in result["tenants"]} == deleted_per_tenant
    assert deleted_per_tenant["2"] == 0
    assert delete_everything_eligible(spec, policy, cutoff) == 0  # nothing eligible is left
    # what stayed behind is exactly what the preview said was kept or held
    assert count_rows("occurred_at < %s", [cutoff]) == result["kept"] + result["held"]


def test_keep_rules_protect_rows_they_cannot_decide_in_the_preview_as_in_the_delete(
    events_table, alice
):
    spec, policy = applied(alice, tables=KEEP_LEGAL)
    result = preview(spec, policy_id=policy.pk)
    cutoff = datetime.fromisoformat(result["cutoff"])
    legal = count_rows("occurred_at < %s AND status = 'legal'", [cutoff])
    unknown = count_rows("occurred_at < %s AND status IS NULL", [cutoff])

    assert result["kept_by_rule"] == [{"rule": "status = 'legal'", "rows": legal + unknown}]
    assert result["kept"] == legal + unknown
    delete_everything_eligible(spec, policy, cutoff)
    assert count_rows("occurred_at < %s AND status IS NULL", [cutoff]) == unknown


def test_the_preview_reports_buckets_samples_chunks_and_drain_time(events_table, alice):
    spec, policy = applied(alice)
    result = preview(spec, policy_id=policy.pk)

    assert sum(b["eligible"] for b in result["age_buckets"]) == result["eligible"]
    assert all(len(b["label"]) == 7 for b in result["age_buckets"])  # YYYY-MM
    assert result["sample_keys"] == sorted(result["sample_keys"])
    assert len(result["sample_keys"]) == 10
    assert result["sample_keys"][0] == result["key_range"][0]
    assert result["estimated_chunks"] == -(-result["eligible"] // 500)
    assert result["rows_per_second"] == ASSUMED_ROWS_PER_SECOND * spec.policy_workers
    assert result["rate_source"] == "assumed"
    assert result["drain_seconds"] == round(result["eligible"] / result["rows_per_second"], 1)
    assert result["tenant_count"] == 5 and result["other_tenants"] is None
    json.dumps(result)  # stored as JSON on the version


def test_tenants_beyond_the_top_twenty_are_summed_as_others(events_table, alice):
    with connection.cursor() as cur:
        cur.execute("UPDATE public.t_events SET tenant_id = id % 30")
    spec, policy = applied(alice)

    result = preview(spec, policy_id=policy.pk)

    assert len(result["tenants"]) == 20
    assert result["tenant_count"] == 30
    shown = sum(t["eligible"] for t in result["tenants"])
    assert result["other_tenants"] == {"tenants": 10, "eligible": result["eligible"] - shown}


def test_the_preview_uses_the_cutoff_of_the_latest_scheduled_tick(events_table, alice):
    spec, policy = applied(alice)  # 03:00 Europe/Berlin, 30 days
    now = timezone.now()

    result = preview(spec, policy_id=policy.pk, now=now)

    tick = latest_tick(spec, now)
    assert datetime.fromisoformat(result["tick"]) == tick
    assert datetime.fromisoformat(result["cutoff"]) == spec.cutoff_for(tick)


def test_the_latest_tick_counts_a_tick_exactly_at_now_and_follows_the_local_clock():
    spec = load_toml(policy_toml())  # 0 3 * * * Europe/Berlin
    summer_tick = datetime(2026, 7, 1, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert latest_tick(spec, summer_tick) == summer_tick
    assert latest_tick(spec, datetime(2026, 7, 1, 0, 59, tzinfo=UTC)) == datetime(
        2026, 6, 30, 1, 0, tzinfo=UTC
    )
    assert latest_tick(spec, datetime(2026, 12, 1, 12, 0, tzinfo=UTC)) == datetime(
        2026, 12, 1, 2, 0, tzinfo=UTC
    )  # 03:00 CET


def test_a_preview_that_exceeds_its_timeout_says_so(events_table, alice, second_connection):
    spec, policy = applied(alice)
    blocker = second_connection
    blocker.execute("LOCK TABLE public.t_events IN ACCESS EXCLUSIVE MODE")
    try:
        result = preview(spec, policy_id=policy.pk, timeout_ms=300)
    finally:
        blocker.rollback()

    assert result["timed_out"] is True
    assert result["error"] == "a preview query exceeded the 0.3 s statement timeout"
    assert result["eligible"] == 0
    # the timeout was local to the preview
    with connection.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()[0] == "0"


def test_the_preview_command_prints_the_numbers_as_json(events_table, alice):
    spec, policy = applied(alice)
    out = io.StringIO()

    call_command("retention", "policy", "preview", "events", "--json", stdout=out)

    data = json.loads(out.getvalue())
    assert data["version"] == 1 and data["version_state"] == "draft"
    assert data["eligible"] == preview(spec, policy_id=Policy.objects.get().pk)["eligible"]


def _preview_cli(slug: str) -> str:
    out = io.StringIO()
    call_command("retention", "policy", "preview", slug, stdout=out)
    return out.getvalue()


def test_a_preview_with_nothing_eligible_quotes_no_rate_and_no_drain_time(events_table, alice):
    applied(alice, retention='"900 days"')  # older than every row: nothing eligible
    text = _preview_cli("events")
    assert "None" not in text
    assert "eligible 0, kept 0, held 0, nothing to drain" in text
    result = preview(load_toml(policy_toml(retention='"900 days"')), policy_id=1)
    assert result["rows_per_second"] is None and result["drain_seconds"] == 0.0


def test_the_preview_says_what_becomes_of_rows_without_a_tenant(events_table, alice):
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.t_events ALTER COLUMN tenant_id DROP NOT NULL")
        cur.execute("UPDATE public.t_events SET tenant_id = NULL WHERE id % 10 = 0")
    kept_spec, policy = applied(alice)
    kept = preview(kept_spec, policy_id=policy.pk)
    cutoff = datetime.fromisoformat(kept["cutoff"])
    without = count_rows("tenant_id IS NULL AND occurred_at < %s", [cutoff])
    assert without > 0
    assert kept["without_tenant"] == {"rows": without, "null_tenant": "keep"}
    assert kept["not_eligible_null"]["tenant"] == without
    assert f'rows without a tenant: {without:,}, kept (null_tenant = "keep")' in _preview_cli(
        "events"
    )

    deleted_spec, _ = applied(alice, null_tenant='"delete"', chunking='"key"')
    deleted = preview(deleted_spec, policy_id=policy.pk)
    assert deleted["without_tenant"] == {"rows": without, "null_tenant": "delete"}
    assert "tenant" not in deleted["not_eligible_null"]
    assert deleted["eligible"] == kept["eligible"] + without
    # the DELETE agrees: the rows without a tenant go with the others
    assert delete_everything_eligible(deleted_spec, policy, cutoff) == deleted["eligible"]
