"""One truthful number per rollout stage: a policy promoted count → slice → full shows, at
each stage, the same number on the approval card, in ``retention policy plan``, in the
drain window and as the run's final count (exactly, on a quiet table)."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from retention import actions as retention_actions
from retention.schedule_math import latest_tick
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.counts import count_totals
from runs.engine import worker
from runs.forecast import drain_window
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import create_events

pytestmark = pytest.mark.django_db(transaction=True)

SLICE = "8 days"


def quiet_events() -> None:
    """rr_events with no row near any cutoff or slice bound the test's ticks (today's and
    the two days before) can have: no row 15–25 days old (the cutoffs: 20–23 days) nor
    27–33 days old (the slice bounds: 28–31 days)."""
    create_events(3000, days=60)
    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM public.rr_events WHERE occurred_at BETWEEN now() - interval '25 days'"
            " AND now() - interval '15 days' OR occurred_at BETWEEN now() - interval '33 days'"
            " AND now() - interval '27 days'"
        )


def card_number(client, slug: str) -> tuple[int, str]:
    html = client.get(reverse("retention:approvals")).content.decode()
    card = html[html.index(f"/policies/{slug}/") :]
    found = re.search(
        r'data-testid="eligible-now">v\d+: ([^<]*)<strong data-count="new">([\d,]+)', card
    )
    assert found, card[:2000]
    return int(found.group(2).replace(",", "")), found.group(1)


def plan_number(tmp_path, spec: PolicySpec) -> str:
    (tmp_path / f"{spec.slug}.toml").write_text(spec.to_toml())
    out = io.StringIO()
    try:
        call_command("retention", "policy", "plan", str(tmp_path), stdout=out)
    except SystemExit:
        pass
    return out.getvalue()


def drain(run: Run) -> Run:
    for _ in range(20):
        worker.drain(run.pk, until_idle=True, budget_s=60)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    return run


def final_count(run: Run) -> int:
    if run.counts_only:
        return count_totals(run)["rows"]
    return int(run.audit_records.aggregate(s=Sum("rows_deleted"))["s"] or 0)


def test_each_stage_shows_one_number_from_card_to_run(make_user, client_for, tmp_path, no_guard):
    quiet_events()
    author = make_user("alice-rollout", "compliance")
    approver = make_user("carol-rollout", "compliance")
    client = client_for("compliance")
    base = latest_tick(PolicySpec.parse(events_spec(schedule="0 3 * * *")), timezone.now())
    seen = []
    for day, stage in enumerate(("count", "slice", "full")):
        fields = events_spec(schedule="0 3 * * *", rollout=stage)
        if stage == "slice":
            fields["slice"] = SLICE
        version_spec = PolicySpec.parse(fields)
        version = retention_actions.apply_spec(version_spec, author=author)
        version = retention_actions.submit_version(version, actor=author, reason=stage)
        on_card, words = card_number(client, "events")
        planned = plan_number(tmp_path, version_spec)
        if stage == "count":
            assert words.strip() == "would count"
            found = re.search(r"would count ([\d,]+), deletes nothing", planned)
        elif stage == "slice":
            found = re.search(r"would delete ([\d,]+) \(older than the cutoff", planned)
        else:
            found = re.search(r"eligible (\d+),", planned)
        assert found, planned
        in_plan = int(found.group(1).replace(",", ""))
        retention_actions.approve_version(version, actor=approver, reason=stage)
        policy = version.policy
        policy.refresh_from_db()
        window = drain_window(policy, fresh=True)["backlog_rows"]
        run, created = trigger_run(policy, tick=base - timedelta(days=2 - day), actor="scheduler")
        assert created and run.rollout == stage
        run = drain(run)
        assert run.state in (Run.State.COUNTED, Run.State.DRAINED), run.state_reason
        final = final_count(run)
        if stage == "count":  # a count version's drain window is judged from its count run
            window = drain_window(policy, fresh=True)["backlog_rows"]
        seen.append((stage, on_card, in_plan, window, final))
        assert on_card == in_plan == window == final > 0, seen
    assert seen[1][4] + seen[2][4] == seen[0][4]  # slice and full delete what was counted
    assert 0 < seen[1][4] < seen[0][4]
    print("stage, card, plan, drain window, final:", seen)


def test_a_count_run_says_how_many_chunks_it_counted(make_user, client_for, no_guard):
    from runs.models import Chunk
    from runs.progress import progress_for
    from tests.runs.conftest import NOW

    create_events(3000)
    policy = approved_policy(make_user, **events_spec(rollout="count"))
    run = drain(trigger_run(policy, tick=NOW)[0])
    assert run.state == Run.State.COUNTED
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).count()
    assert done > 1
    p = progress_for([run.pk], now=timezone.now())[run.pk]
    assert (p.chunks_done, p.chunks_total) == (done, done)
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert f"{done}/{done} chunks counted" in html
