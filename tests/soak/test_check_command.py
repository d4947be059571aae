"""``retention check RUN_KEY --shadow schema.table``: the invariant checker for an operator."""

from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from retention.models import LegalHold
from runs.actions import trigger_run
from runs.engine import worker
from runs.models import AuditRecord, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count, create_events, manage

pytestmark = pytest.mark.usefixtures("no_guard")

SHADOW = "public.rr_events_shadow"


@pytest.fixture
def drained(events_policy):
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def check(*args: str) -> str:
    out = StringIO()
    call_command("retention", "check", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def problems(*args: str) -> str:
    """The problems the command lists (its stderr) when it fails."""
    err = StringIO()
    with pytest.raises(CommandError, match="invariant\\(s\\) broken"):
        call_command("retention", "check", *args, stdout=StringIO(), stderr=err)
    return err.getvalue()


def test_a_drained_run_passes_every_invariant_against_its_shadow(drained):
    out = check(drained.run_key, "--shadow", SHADOW)
    assert "every invariant holds" in out
    assert "rr_events_shadow" in out


def test_a_kept_row_that_disappeared_is_reported(drained):
    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM public.rr_events WHERE id = (SELECT min(id) FROM public.rr_events"
            " WHERE status = 'disputed' AND occurred_at < %s)",
            [drained.cutoff],
        )
    listed = problems(drained.run_key, "--shadow", SHADOW)
    assert "1 row(s) outside the run's scope (newer, kept or held) are gone" in listed
    assert "1 row(s) gone but 0 audited" not in listed  # the run audited its own deletions


def test_a_row_newer_than_the_cutoff_that_disappeared_is_reported(drained):
    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM public.rr_events WHERE id = (SELECT max(id) FROM public.rr_events)"
        )
    assert "1 row(s) outside the run's scope" in problems(drained.run_key, "--shadow", SHADOW)


def test_an_eligible_row_left_behind_is_reported_for_a_drained_run(drained):
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_events SELECT * FROM public.rr_events_shadow s"
            " WHERE NOT EXISTS (SELECT 1 FROM public.rr_events e WHERE e.id = s.id)"
            " AND s.status = 'closed' LIMIT 1"
        )
    assert "1 eligible row(s) still present" in problems(drained.run_key, "--shadow", SHADOW)
    # without the shadow the ledger alone still sees the eligible row
    assert "1 eligible row(s) still present" in problems(drained.run_key)


def _drained_under_a_hold(policy, make_user):
    """A run drained while a hold on tenant 3 was in force; the hold released afterwards."""
    from retention.actions import place_hold
    from tests.factories import release_hold

    hilda = make_user("hilda", "compliance")
    hold = place_hold(actor=hilda, reason="litigation", policy=policy, tenant="3")
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    held = count("rr_events", "tenant_id = 3 AND status = 'closed' AND occurred_at < %s",
                 [run.cutoff])  # fmt: skip
    assert held > 0 and run.verification["deferred_by_holds"] == held
    assert run.verification["holds"] == [hold.pk]
    release_hold(hold, requester=hilda, approver=make_user("ivan", "compliance"), reason="closed")
    assert count("rr_events", "tenant_id = 3 AND status = 'closed' AND occurred_at < %s",
                 [run.cutoff]) == held  # fmt: skip
    return run, hold


def test_rows_a_hold_deferred_at_verification_are_not_reported_after_its_release(
    events_policy, make_user
):
    run, _ = _drained_under_a_hold(events_policy, make_user)
    # the held rows stay for the policy's next run: the run was drained when it was verified
    assert "every invariant holds" in check(run.run_key, "--shadow", SHADOW)
    assert "every invariant holds" in check(run.run_key)


def test_a_verification_that_names_no_holds_is_judged_by_the_holds_times(events_policy, make_user):
    run, hold = _drained_under_a_hold(events_policy, make_user)
    # a run verified before verifications named their holds
    Run.objects.filter(pk=run.pk).update(
        verification={k: v for k, v in run.verification.items() if k != "holds"}
    )
    assert "every invariant holds" in check(run.run_key, "--shadow", SHADOW)
    # a hold placed and released before the verification defers nothing
    checked_at = datetime.fromisoformat(run.verification["checked_at"])
    LegalHold.objects.filter(pk=hold.pk).update(
        placed_at=checked_at - timedelta(minutes=2), released_at=checked_at - timedelta(minutes=1)
    )
    assert "eligible row(s) still present" in problems(run.run_key)


def test_a_hold_placed_after_the_verification_excuses_no_eligible_row_left_behind(
    drained, make_user
):
    from retention.actions import place_hold

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_events SELECT * FROM public.rr_events_shadow s"
            " WHERE NOT EXISTS (SELECT 1 FROM public.rr_events e WHERE e.id = s.id)"
            " AND s.status = 'closed' ORDER BY s.id LIMIT 1 RETURNING id, tenant_id"
        )
        key, tenant = cur.fetchone()
    compliance = make_user("hilda", "compliance")
    hold = place_hold(actor=compliance, reason="late", policy=drained.policy, tenant=str(tenant))
    assert "1 eligible row(s) still present" in problems(drained.run_key)
    # nor does a verification that names a hold it could not have seen
    Run.objects.filter(pk=drained.pk).update(
        verification={**drained.verification, "holds": [hold.pk]}
    )
    listed = problems(drained.run_key)
    assert f"the verification names hold #{hold.pk}, placed after it" in listed
    assert "1 eligible row(s) still present" in listed


def test_a_run_in_progress_is_checked_without_expecting_it_drained(events_policy):
    from runs.engine import planner

    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=2)
    assert worker.process_one(Run.objects.get(pk=run.pk)).kind == worker.DONE
    assert "every invariant holds" in check(run.run_key, "--shadow", SHADOW)
    assert "still present under the cutoff" in problems(
        run.run_key, "--shadow", SHADOW, "--expect-drained"
    )


@pytest.mark.parametrize(
    "shadow",
    ["rr_events_shadow", "public.rr_events_shadow; DROP TABLE public.rr_events",
     'public."rr_events"', "public.rr_events_shadow\n", "public.nope", "a.b.c"],
)  # fmt: skip
def test_a_malformed_or_unknown_shadow_is_one_clear_error(drained, shadow):
    rows = count("rr_events")
    with pytest.raises(CommandError, match="--shadow"):
        check(drained.run_key, "--shadow", shadow)
    assert count("rr_events") == rows


def test_an_unknown_run_key_is_one_clear_error(db):
    with pytest.raises(CommandError, match="no run with key"):
        check("nope/2026-01-01T00:00")


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_command_exits_1_and_lists_the_problems(make_user):
    create_events(1200)
    try:
        policy = approved_policy(
            make_user, slug="events", table="public.rr_events", key="id",
            timestamp="occurred_at", tenant="tenant_id", retention="20 days",
            schedule="0 3 * * *", chunk_size=200,
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
        )  # fmt: skip
        run, _ = trigger_run(policy, tick=NOW)
        worker.drain(run.pk, budget_s=60)
        ok = manage("retention", "check", run.run_key, "--shadow", SHADOW)
        assert ok.returncode == 0, ok.stderr
        assert AuditRecord.objects.filter(run=run).exists()
        with connection.cursor() as cur:
            cur.execute("DELETE FROM public.rr_events WHERE status = 'disputed'")
        broken = manage("retention", "check", run.run_key, "--shadow", SHADOW)
        assert broken.returncode == 1
        assert "outside the run's scope" in broken.stderr
        assert "gone but" in broken.stderr
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
