"""Staged rollout on real PostgreSQL: a count run deletes nothing and counts exactly what a full
run of the same cutoff then deletes; a slice run deletes exactly the rows older than
``cutoff − slice``, holds and keep rules included, one chunk at a time."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command

from retention import actions as retention_actions
from retention.models import PolicyVersion
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.counts import count_inflow, count_totals
from runs.engine import dispatch, worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, Lease, Run
from runs.status import run_status
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count

SHADOW = ("public", "rr_events_shadow")


def _drain(run: Run) -> Run:
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    return run


def _hold_tenant_3(make_user, policy=None):
    """A legal hold on tenant 3 (of ``policy``; None: of every policy)."""
    return retention_actions.place_hold(
        actor=make_user("carol-rollout", "compliance"), reason="litigation", policy=policy,
        tenant="3",
    )  # fmt: skip


def test_a_count_run_deletes_nothing_and_counts_what_the_full_run_then_deletes(events, make_user):
    policy = approved_policy(make_user, **events_spec(rollout="count"))
    _hold_tenant_3(make_user)  # on every policy
    before = count("rr_events")

    counted = _drain(trigger_run(policy, tick=NOW)[0])

    assert counted.state == Run.State.COUNTED, counted.state_reason
    assert counted.rollout == "count"
    assert count("rr_events") == before  # nothing deleted
    assert AuditRecord.objects.filter(run=counted).count() == 0
    totals = count_totals(counted)
    assert totals["chunks"] == Chunk.objects.filter(run=counted, state="done").count() > 1
    # kept and held rows are counted apart, by the same predicate the DELETE uses (a keep rule
    # that cannot be decided, on a NULL status, keeps the row)
    old = "occurred_at < %s"
    assert totals["kept"] == count(
        "rr_events", old + " AND (status = 'disputed' OR status IS NULL)", [counted.cutoff]
    )
    assert totals["held"] == count(
        "rr_events", old + " AND tenant_id = 3 AND status = 'closed'",
        [counted.cutoff],
    )  # fmt: skip
    assert sum(totals["tenants"].values()) == totals["rows"] == sum(totals["ages"].values())
    assert "3" not in totals["tenants"]
    status = run_status(counted)
    assert status["rollout"] == "count" and status["rows_counted"] == totals["rows"]
    out = io.StringIO()  # the command line's JSON is the same read model
    call_command("retention", "status", counted.run_key, "--json", stdout=out)
    printed = json.loads(out.getvalue())
    assert (printed["state"], printed["rollout"], printed["rows_counted"]) == (
        "counted", "count", totals["rows"],
    )  # fmt: skip
    assert check_run(counted, shadow=SHADOW, expect_drained=False) == []

    # a full run of the same cutoff (the same schedule, retention and tick) then deletes
    # exactly what the count run found
    full = approved_policy(make_user, **events_spec(slug="events-full"))
    deleted_run = _drain(trigger_run(full, tick=NOW)[0])
    assert deleted_run.state == Run.State.DRAINED, deleted_run.state_reason
    assert deleted_run.cutoff == counted.cutoff
    deleted = before - count("rr_events")
    assert deleted == status["rows_counted"] > 0
    assert check_run(deleted_run, shadow=SHADOW) == []


def test_a_slice_run_deletes_only_rows_older_than_cutoff_minus_slice(events, make_user):
    policy = approved_policy(make_user, **events_spec(rollout="slice", slice="10 days"))
    _hold_tenant_3(make_user, policy)
    run, _ = trigger_run(policy, tick=NOW)
    bound = run.cutoff - timedelta(days=10)
    assert run.rollout == "slice" and run.slice_bound == bound
    assert dispatch.concurrency_of(run) == 1  # the lowest concurrency: one lease
    assert Lease.objects.filter(run=run).count() == 1
    young_old = count("rr_events", "occurred_at >= %s AND occurred_at < %s", [bound, run.cutoff])
    kept = count(
        "rr_events", "occurred_at < %s AND (status = 'disputed' OR status IS NULL)", [bound]
    )
    held = count(
        "rr_events", "occurred_at < %s AND tenant_id = 3 AND status = 'closed'",
        [bound],
    )  # fmt: skip

    run = _drain(run)

    assert run.state == Run.State.DRAINED, run.state_reason
    # nothing younger than the bound was touched, eligible or not
    assert count("rr_events", "occurred_at >= %s AND occurred_at < %s", [bound, run.cutoff]) == (
        young_old
    )
    # older than the bound: only kept and held rows are left
    assert count("rr_events", "occurred_at < %s", [bound]) == kept + held > 0
    assert run.verification["remaining"] == 0
    assert f"no eligible row older than the slice bound {bound:%Y-%m-%d %H:%M} left" in (
        run.state_reason
    )
    assert run.verification["deferred_by_holds"] == held
    assert set(AuditRecord.objects.filter(run=run).values_list("cutoff", flat=True)) == {bound}
    assert run_status(run)["slice_bound"] == bound.isoformat()
    # the shadow copy: exactly the rows a judge computing cutoff − slice from the spec names
    assert check_run(run, shadow=SHADOW) == []


def test_promotion_is_a_new_version_that_needs_a_second_person(events, make_user):
    policy = approved_policy(make_user, **events_spec(rollout="count"))
    author = make_user("alice-rollout", "compliance")
    spec = PolicySpec.parse(events_spec(rollout="slice", slice="10 days"))
    version = retention_actions.apply_spec(spec, author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = retention_actions.submit_version(version, actor=author, reason="slice next")
    with pytest.raises(Exception, match="cannot approve it; another member of compliance must"):
        retention_actions.approve_version(version, actor=author, reason="my own")
    policy.refresh_from_db()
    assert policy.approved_version.parsed.rollout == "count"
    retention_actions.approve_version(
        version, actor=make_user("bob-rollout", "compliance"), reason="reviewed"
    )
    policy.refresh_from_db()
    assert policy.approved_version.parsed.rollout == "slice"


def test_two_count_runs_show_the_inflow(events, make_user):
    policy = approved_policy(make_user, **events_spec(rollout="count"))
    first = _drain(trigger_run(policy, tick=NOW - timedelta(days=2))[0])
    second = _drain(trigger_run(policy, tick=NOW)[0])
    assert first.state == second.state == Run.State.COUNTED
    inflow = count_inflow(policy)
    a, b = count_totals(first)["rows"], count_totals(second)["rows"]
    assert b > a
    assert inflow["older_rows"] == a and inflow["newer_rows"] == b
    assert inflow["inflow_per_day"] == round((b - a) / 2)


def test_rollout_fields_are_checked():
    base = events_spec()
    with pytest.raises(SpecError, match="needs slice"):
        PolicySpec.parse({**base, "rollout": "slice"})
    with pytest.raises(SpecError, match='only with rollout = "slice"'):
        PolicySpec.parse({**base, "slice": "3 days"})
    with pytest.raises(SpecError, match="rollout must be one of"):
        PolicySpec.parse({**base, "rollout": "half"})
    # a version without the fields keeps its content hash (left out at their defaults)
    assert "rollout" not in PolicySpec.parse(base).to_json()
    spec = PolicySpec.parse({**base, "rollout": "slice", "slice": "2 weeks"})
    from retention.spec import load_toml

    assert load_toml(spec.to_toml()) == spec


def test_the_reconciler_concludes_a_count_run_and_never_treats_it_as_lost_work(events, make_user):
    from runs.engine import planner, reconciler

    policy = approved_policy(make_user, **events_spec(rollout="count", schedule="0 3 * * *"))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=10_000)
    while worker.process_one(run).kind == worker.DONE:  # its worker died before finishing
        pass
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE and run.planner_done
    generations = sorted(Lease.objects.filter(run=run).values_list("generation", flat=True))

    report = reconciler.reconcile(now=NOW)
    run.refresh_from_db()
    assert (run.run_key, Run.State.COUNTED) in report["finished"]
    assert run.state == Run.State.COUNTED and run.finished_at is not None
    assert run.verification["rows_counted"] == count_totals(run)["rows"] > 0

    again = reconciler.reconcile(now=NOW)
    assert again["republished"] == 0 and again["rerun"] == [] and again["finished"] == []
    assert sorted(Lease.objects.filter(run=run).values_list("generation", flat=True)) == (
        generations
    )
    assert Run.objects.filter(policy=policy).count() == 1  # the period is not run again


def test_a_runs_rollout_stage_and_slice_bound_never_change(events, make_user):
    from django.db import DatabaseError, transaction

    policy = approved_policy(make_user, **events_spec(rollout="slice", slice="10 days"))
    run, _ = trigger_run(policy, tick=NOW)
    for change in ({"rollout": "full"}, {"slice_bound": None}, {"slice_bound": run.cutoff}):
        with pytest.raises(DatabaseError, match="rollout stage and slice bound never change"):
            with transaction.atomic():
                Run.objects.filter(pk=run.pk).update(**change)
    run.refresh_from_db()
    assert run.rollout == "slice" and run.slice_bound == run.cutoff - timedelta(days=10)
