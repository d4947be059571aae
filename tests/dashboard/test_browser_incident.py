"""The incident drill in headless Chromium: a column renamed under a live run is one problem
— one attention item naming the cause, at most a handful of dead letters, the chunks kept
pending — and after it is renamed back, one "retry the run" drains it exactly. And a bulk
replay from the dead-letter page admits the run at once."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from playwright.sync_api import expect

from core.models import OperatorAction
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Chunk, DeadLetter, Lease, Run
from tests.dashboard.test_browser_run_controls import watch_console
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ELIGIBLE = "occurred_at < %s AND (status = 'disputed') IS FALSE"


def drain(run: Run) -> Run:
    for _ in range(20):
        worker.drain(run.pk, until_idle=True, budget_s=60)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    return run


def rename(old: str, new: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE public.rr_events RENAME COLUMN {old} TO {new}")


@pytest.fixture
def live_run(make_user, no_guard):
    """An active run of rr_events, planned whole, two chunks deleted: (run, eligible rows)."""
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=1000)
    eligible = count("public.rr_events", ELIGIBLE, [run.cutoff])
    for _ in range(2):
        assert worker.process_one(run).kind == worker.DONE
    return run, eligible


def deleted(run: Run) -> int:
    return int(run.audit_records.aggregate(s=Sum("rows_deleted"))["s"] or 0)


def test_a_column_renamed_under_a_live_run_is_one_attention_item_and_one_retry_drains_it(
    login,  # noqa: F811
    live_server,
    live_run,
):
    run, eligible = live_run
    rename("status", "status_renamed")
    run = drain(run)
    assert run.state == Run.State.ATTENTION

    page = login("oncall")
    errors = watch_console(page)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    item = page.get_by_test_id("attention-item")
    expect(item).to_have_count(1)
    expect(item).to_contain_text("circuit breaker open")
    expect(item).to_contain_text("42703 column status")
    letters = DeadLetter.objects.filter(run=run).count()
    assert 1 <= letters <= settings.RETENTION["BREAKER_CHUNKS"]  # a handful, not one per chunk
    pending = Chunk.objects.filter(run=run, state=Chunk.State.PENDING).count()
    assert pending > 5
    page.goto(f"{live_server.url}/?policy=events")
    expect(page.locator("body")).to_contain_text("needs attention")

    rename("status_renamed", "status")
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.fill('input[aria-label="reason to retry the run"]', "INC-42 column renamed back")
    page.get_by_test_id("retry").click()
    expect(page.locator(".messages, [role=status]").first).to_contain_text("done")
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE
    retried = OperatorAction.objects.filter(action="run.retry", target_id=str(run.pk))
    assert retried.count() == 1
    assert retried.get().reason == "INC-42 column renamed back"
    # the first chunk after the retry is admissible at once
    assert worker._claimable(run, run.policy_version.parsed)

    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert deleted(run) == eligible
    assert count("public.rr_events", ELIGIBLE, [run.cutoff]) == 0
    assert not DeadLetter.objects.filter(run=run, resolution="open").exists()
    page.reload()
    expect(page.get_by_test_id("run-state")).to_have_text("Drained")
    assert errors == []


def test_a_bulk_replay_from_the_page_admits_the_run_at_once(
    login,  # noqa: F811
    live_server,
    live_run,
    settings,
):
    # the breaker set out of reach: every chunk dead-letters, as before it existed
    settings.RETENTION = {**settings.RETENTION, "BREAKER_CHUNKS": 10_000}
    run, eligible = live_run
    rename("status", "status_renamed")
    run = drain(run)
    letters = DeadLetter.objects.filter(run=run, resolution="open").count()
    assert letters > 5
    rename("status_renamed", "status")
    generations = dict(Lease.objects.filter(run=run).values_list("slot", "generation"))

    page = login("oncall")
    errors = watch_console(page)
    page.goto(f"{live_server.url}/runs/dead-letters/?run={run.pk}")
    page.check("#tick-all-letters")
    ticked = page.locator('input[type=checkbox][form="bulk-letters"]:checked')
    expect(ticked).to_have_count(letters)
    expect(page.get_by_test_id("matching-count")).to_contain_text(f"All {letters} open letters")
    page.fill('input[aria-label="reason for every matching letter"]', "INC-43 column back")
    page.get_by_test_id("replay-matching").click()
    expect(page.get_by_test_id("no-dead-letters")).to_be_visible()
    assert page.locator("body").inner_text().count(f"Replay: {letters} dead letters") == 1

    row = OperatorAction.objects.get(action="dead_letter.replay_many")
    assert len(row.details["dead_letters"]) == letters and row.reason == "INC-43 column back"
    # admitted at once: every pending chunk claimable now, one fresh generation per slot
    now = timezone.now()
    assert not Chunk.objects.filter(run=run, state="pending", not_before__gt=now).exists()
    assert worker._claimable(run, run.policy_version.parsed)
    after = dict(Lease.objects.filter(run=run).values_list("slot", "generation"))
    assert {slot: after[slot] - generations.get(slot, 0) for slot in after} == {
        slot: 1 for slot in after
    }
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert deleted(run) == eligible
    assert errors == []
