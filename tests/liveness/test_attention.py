"""A way out of "needs attention": a permanent row error is bisected down to its rows, and a
discarded scope no longer counts as remaining."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from runs.actions import discard_dead_letter, trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import check_run
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


def test_a_discarded_scope_is_left_out_of_later_passes_and_their_deletes(events_policy, make_user):
    """Pass 2 re-plans rows on both sides of a discarded key: its chunk spans the discarded
    scope, yet neither the plan nor the DELETE touches it, and no new dead letter appears."""
    from retention.actions import place_hold
    from runs.models import Chunk
    from tests.factories import release_hold

    run, _ = trigger_run(events_policy, tick=NOW)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT min(id) FROM public.rr_events WHERE tenant_id = 1 AND status = 'closed'"
            " AND occurred_at < %s AND id > 10",
            [run.cutoff],
        )
        pinned = cur.fetchone()[0]
        cur.execute(
            "SELECT max(id) FILTER (WHERE id < %s), min(id) FILTER (WHERE id > %s)"
            " FROM public.rr_events WHERE tenant_id = 1 AND status = 'closed'"
            " AND occurred_at < %s",
            [pinned, pinned, run.cutoff],
        )
        below, above = cur.fetchone()
        cur.execute(
            "CREATE TABLE public.rr_child (event_id bigint REFERENCES public.rr_events (id)"
            " ON DELETE RESTRICT)"
        )
        cur.execute("INSERT INTO public.rr_child VALUES (%s)", [pinned])
    # the neighbours are held through pass 1, released after the discard: pass 2 finds them
    lena, mia = make_user("lena", "compliance"), make_user("mia", "compliance")
    holds = [
        place_hold(actor=lena, reason="audit", policy=events_policy, tenant="1", key_from=k,
                   key_to=k + 1)
        for k in (below, above)
    ]  # fmt: skip
    try:
        run = drain(run)
        assert run.state == Run.State.ATTENTION, run.state_reason
        letter = DeadLetter.objects.get(run=run, resolution="open")
        assert (letter.chunk.key_from, letter.chunk.key_to) == (pinned, pinned + 1)
        discard_dead_letter(
            letter, actor=make_user("olga", "oncall"), reason="row pinned by an invoice"
        )
        for hold in holds:  # released as production releases: one asks, another approves
            release_hold(hold, requester=lena, approver=mia, reason="audit done")
        run = drain(Run.objects.get(pk=run.pk))
        assert run.state == Run.State.DRAINED, run.state_reason
        assert run.pass_no == 2, run.state_reason
        assert DeadLetter.objects.filter(run=run).count() == 1
        second = Chunk.objects.filter(run=run, pass_no=2)
        assert sum(c.planned_rows for c in second) == 2
        assert any(c.key_from <= pinned < (c.key_to or pinned + 1) for c in second)
        assert count("rr_events", "id IN (%s, %s)", [below, above]) == 0
        assert count("rr_events", "id = %s", [pinned]) == 1
        assert run.verification["remaining"] == 0
        assert "1 row(s) discarded by olga (row pinned by an invoice)" in run.state_reason
        assert check_run(run, shadow=SHADOW, expect_drained=False) == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_child")


def test_a_run_excludes_at_most_200_discarded_scopes_and_refuses_one_more(events_policy, make_user):
    from retention.actions import ActionError
    from runs.models import MAX_DISCARDED_SCOPES, Chunk

    run, _ = trigger_run(events_policy, tick=NOW)
    n = MAX_DISCARDED_SCOPES + 1
    chunks = Chunk.objects.bulk_create(
        Chunk(run=run, pass_no=1, tenant="1", seq=i, key_from=10 * i, key_to=10 * i + 1,
              planned_rows=1, state=Chunk.State.DEAD)
        for i in range(n)
    )  # fmt: skip
    letters = DeadLetter.objects.bulk_create(
        DeadLetter(chunk=c, run=run, error_class="permanent", message="pinned") for c in chunks
    )
    DeadLetter.objects.filter(pk__in=[x.pk for x in letters[:-1]]).update(
        resolution="discarded", resolved_by="olga", resolution_reason="pinned"
    )
    with pytest.raises(ActionError, match="already excludes 200 discarded scopes"):
        discard_dead_letter(letters[-1], actor=make_user("olga", "oncall"), reason="pinned too")
    assert DeadLetter.objects.get(pk=letters[-1].pk).resolution == "open"


def _scan(frag) -> list[str]:
    """The plan's scan of the target table: node and index condition, costs left out."""

    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + frag.sql.as_string(cur.connection), frag.params)
        lines = [r[0] for r in cur.fetchall()]
    at = next(i for i, line in enumerate(lines) if "Scan" in line and " on rr_events t" in line)
    return [re.sub(r"\(cost=.*\)", "", line).strip() for line in lines[at : at + 2]]


def test_discarded_scopes_leave_the_chunk_delete_on_its_key_range_index_scan(events_policy):
    from retention import predicate as P
    from runs.models import MAX_DISCARDED_SCOPES

    run, _ = trigger_run(events_policy, tick=NOW)
    spec = run.policy_version.parsed
    scopes = [P.Scope("1", k, k + 1) for k in range(11, 11 + 2 * MAX_DISCARDED_SCOPES, 2)]
    args = dict(policy_id=run.policy_id, cutoff=run.cutoff, tenant="1", key_from=1, key_to=400)
    plain = _scan(P.delete_chunk(spec, **args))
    excluding = _scan(P.delete_chunk(spec, **args, outside=scopes))
    # the key range is the index condition (PostgreSQL 15 adds a redundant "id IS NOT NULL"; the
    # bounds may be printed as typed literals, '1'::bigint)
    condition = re.sub(r"'(\d+)'::bigint", r"\1", plain[1])
    assert condition.startswith("Index Cond: ((id >= 1) AND (id < 400)"), plain
    assert excluding == plain
