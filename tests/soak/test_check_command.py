"""``retention check RUN_KEY --shadow schema.table``: the invariant checker for an operator."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from runs import worker
from runs.actions import trigger_run
from runs.models import AuditRecord, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count, create_events, manage

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


def test_a_run_in_progress_is_checked_without_expecting_it_drained(events_policy):
    from runs import planner

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
