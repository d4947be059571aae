"""Rollout stages on the tables that take more than a DELETE: on a range-partitioned table a
count run takes no partition (it counts every row chunk by chunk) and counts exactly what a
full run of the same cutoff then removes, whole partitions included; a slice run takes whole
only the partitions past its slice bound; on a table cascades reach, the count applies the
DELETE's cascade guard."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from retention import actions as retention_actions
from runs.actions import trigger_run
from runs.counts import count_totals
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, PartitionAction, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count
from tests.runs.test_cascades import posts  # noqa: F401 (the fixture)
from tests.runs.test_partitions import MONTHS, attached, create_partitioned, parts_spec

pytestmark = [pytest.mark.django_db(transaction=True)]

SHADOW = ("public", "rr_parts_shadow")


@pytest.fixture
def parts(transactional_db, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned()
    yield "rr_parts"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def _drain(run: Run) -> Run:
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    return run


def test_a_count_run_takes_no_partition_and_counts_what_the_full_run_removes(parts, make_user):
    counting = approved_policy(make_user, **parts_spec(rollout="count"))
    before = count("rr_parts")

    counted = _drain(trigger_run(counting, tick=NOW)[0])

    assert counted.state == Run.State.COUNTED, counted.state_reason
    assert count("rr_parts") == before
    assert not PartitionAction.objects.filter(run=counted).exists()
    assert all(attached(f"rr_parts_{m}") for m in MONTHS)
    rows = count_totals(counted)["rows"]

    full = approved_policy(
        make_user, **events_spec(slug="parts-full", table="rr_parts", retention="120 days")
    )
    deleted_run = _drain(trigger_run(full, tick=NOW)[0])
    assert deleted_run.state == Run.State.DRAINED, deleted_run.state_reason
    assert PartitionAction.objects.filter(run=deleted_run, state="dropped").exists()
    assert before - count("rr_parts") == rows > 0
    assert check_run(deleted_run, shadow=SHADOW) == []


def test_a_slice_run_takes_whole_only_partitions_past_its_slice_bound(parts, make_user):
    policy = approved_policy(make_user, **parts_spec(rollout="slice", slice="60 days"))
    run = _drain(trigger_run(policy, tick=NOW)[0])

    assert run.state == Run.State.DRAINED, run.state_reason
    assert run.slice_bound == run.cutoff - timedelta(days=60)  # 2026-06-03 12:00
    taken = {a.name for a in PartitionAction.objects.filter(run=run, state="dropped")}
    # January to May but March, whose kept ('disputed') rows stay: its old rows go in chunks
    assert taken == {f"rr_parts_{m}" for m in ("2026_01", "2026_02", "2026_04", "2026_05")}
    assert attached("rr_parts_2026_03")
    assert attached("rr_parts_2026_06") and attached("rr_parts_2026_07")
    # nothing at or after the bound went, old rows before it did (kept rows stay)
    assert count("rr_parts", "occurred_at >= %s", [run.slice_bound]) == count(
        "rr_parts_shadow", "occurred_at >= %s", [run.slice_bound]
    )
    assert count("rr_parts", "occurred_at < %s AND status = 'closed'", [run.slice_bound]) == 0
    assert {a.cutoff for a in AuditRecord.objects.filter(run=run)} == {run.slice_bound}
    assert check_run(run, shadow=SHADOW) == []


def test_a_count_run_counts_what_a_cascading_delete_then_removes(posts, make_user):  # noqa: F811
    """A self-referencing table whose reposts go with their original (``ON DELETE CASCADE``):
    the count applies the DELETE's cascade guard — a row counts only when its cascade reaches
    no held or young row — and a row a cascade would take is counted in its own chunk."""
    spec = dict(
        table="public.rr_posts", key="id", timestamp="created_at", tenant="tenant_id",
        retention="20 days", schedule="0 3 * * *", timezone="UTC", chunk_size=200,
        chunking="key", cascade_ack=["public.rr_posts"],
    )  # fmt: skip
    counting = approved_policy(make_user, slug="posts-count", rollout="count", **spec)
    full = approved_policy(make_user, slug="posts", **spec)
    retention_actions.place_hold(
        actor=make_user("keeper", "compliance"), reason="case 17", policy=None, tenant="9"
    )
    before = count("public.rr_posts")

    counted = _drain(trigger_run(counting, tick=NOW)[0])
    assert counted.state == Run.State.COUNTED, counted.state_reason
    assert count("public.rr_posts") == before
    totals = count_totals(counted)
    assert totals["cascade"] > 0  # expired originals whose reposts are held or young

    deleted_run = _drain(trigger_run(full, tick=NOW)[0])
    assert deleted_run.state == Run.State.DRAINED, deleted_run.state_reason
    assert before - count("public.rr_posts") == totals["rows"] > 0
    assert deleted_run.verification["deferred_by_cascades"] == totals["cascade"]
    assert check_run(deleted_run, shadow=("public", "rr_posts_shadow")) == []
