"""A way out of "needs attention": a permanent row error is bisected down to its rows, and a
discarded scope no longer counts as remaining."""

from __future__ import annotations

import pytest
from django.db import connection

from runs import planner, worker
from runs.actions import discard_dead_letter, trigger_run
from runs.invariants import check_run
from runs.models import DeadLetter, Run
from tests.runs.conftest import NOW, count

pytestmark = pytest.mark.django_db(transaction=True)
SHADOW = ("public", "rr_events_shadow")


@pytest.fixture(autouse=True)
def no_guard(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}


def drain(run: Run) -> Run:
    for _ in range(20):
        worker.drain(run.pk, until_idle=True, budget_s=60)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    return run


def test_a_restricting_reference_costs_only_its_row_and_a_discard_lets_the_run_drain(
    events_policy, make_user
):
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run, window=1000)
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_child (event_id bigint REFERENCES public.rr_events (id)"
            " ON DELETE RESTRICT)"
        )
        cur.execute(
            "INSERT INTO public.rr_child SELECT min(id) FROM public.rr_events"
            " WHERE status = 'closed' AND occurred_at < %s",
            [run.cutoff],
        )
        cur.execute("SELECT event_id FROM public.rr_child")
        pinned = cur.fetchone()[0]
    try:
        run = drain(run)
        assert run.state == Run.State.ATTENTION, run.state_reason
        letter = DeadLetter.objects.get(run=run, resolution="open")
        assert (letter.chunk.key_from, letter.chunk.key_to) == (pinned, pinned + 1)
        eligible_left = "occurred_at < %s AND status <> 'disputed'"
        assert count("rr_events", eligible_left, [run.cutoff]) == 1  # only the pinned row
        discard_dead_letter(
            letter, actor=make_user("olga", "oncall"), reason="row pinned by an invoice"
        )
        run = drain(Run.objects.get(pk=run.pk))
        assert run.state == Run.State.DRAINED, run.state_reason
        assert "1 row(s) discarded by olga (row pinned by an invoice)" in run.state_reason
        assert run.verification["discarded"][0]["rows"] == 1
        assert count("rr_events", "id = %s", [pinned]) == 1
        problems = check_run(run, shadow=SHADOW, expect_drained=False)
        assert problems == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_child")
