"""One read model of a run's progress: every surface shows the same numbers, and the numbers
are honest (expected rows never below what was deleted, 100% only when drained, no ETA for a
run that is not moving) and type-safe (database sums are Decimals; no page mixes them)."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.formatting import duration, number
from retention.actions import place_hold
from runs import actions
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Chunk, Run
from runs.progress import ETA_SPREAD
from tests.conftest import create_user, fresh
from tests.dashboard.conftest import run_with_three_chunks
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db

PAGES = ("home", "home-fragment", "detail", "detail-fragment", "list", "manifest", "metrics")


def get_page(client, page: str, run: Run):
    if page == "home":
        return client.get(reverse("home"))
    if page == "home-fragment":
        return client.get(reverse("home"), HTTP_HX_REQUEST="true")
    if page == "detail":
        return client.get(reverse("runs:detail", args=[run.pk]))
    if page == "detail-fragment":
        return client.get(reverse("runs:detail", args=[run.pk]), HTTP_HX_REQUEST="true")
    if page == "list":
        return client.get(reverse("runs:list"))
    if page == "manifest":
        return client.get(reverse("runs:manifest", args=[run.pk]))
    return client.get("/metrics")


@pytest.fixture
def fresh_run(events_policy) -> Run:
    """Planned, nothing committed: no rate, no audit row."""
    created, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(created)
    created.refresh_from_db()
    return created


@pytest.fixture(scope="module")
def built(build_once):
    """The runs every state is rendered for, once for the module (``tests.conftest.build_once``):
    one with three chunks committed, one of another policy planned with nothing committed, and
    an auditor to read them. Each test changes them in a savepoint rolled back after it. Their
    names are their own: the module's other tests, built per test, may run beside them."""

    def build():
        create_events(3000, name="rr_states")
        states = approved_policy(create_user, **events_spec(slug="states", table="rr_states"))
        create_events(3000, name="rr_states_planned")
        planned = approved_policy(
            create_user, **events_spec(slug="states-planned", table="rr_states_planned")
        )
        nothing, _ = trigger_run(planned, tick=NOW)
        planner.plan(nothing)
        return {
            "run": run_with_three_chunks(states),
            "fresh_run": Run.objects.get(pk=nothing.pk),
            "reader": create_user("states-reader", "auditor"),
        }

    return build_once(build)


@pytest.mark.parametrize("history", ["recent-rate", "stale-rate", "nothing-committed"])
@pytest.mark.parametrize("state", Run.State.values)
def test_every_page_renders_for_a_run_in_every_state(built, db, monkeypatch, state, history):
    from runs import forecast

    run = fresh(built["fresh_run" if history == "nothing-committed" else "run"])
    if history != "recent-rate":  # as ten minutes after the last commit: no recent rate
        monkeypatch.setattr(forecast, "observed_rate", lambda policy, now=None: None)
    # An admission count above what was deleted (the capped blast-radius count), a start time.
    Run.objects.filter(pk=run.pk).update(
        state=state, expected_rows=10**6, started_at=timezone.now() - timedelta(minutes=3)
    )
    client = Client()
    client.force_login(fresh(built["reader"]))
    for page in PAGES:
        response = get_page(client, page, run)
        if page == "manifest":
            b"".join(response.streaming_content)
        assert response.status_code == 200, (page, state)


def test_a_confirmed_then_paused_run_renders_its_page(client_for, run, make_user):
    oscar = make_user("oscar-2", "oncall")
    Run.objects.filter(pk=run.pk).update(state=Run.State.CONFIRM, started_at=None)
    actions.confirm_run(Run.objects.get(pk=run.pk), actor=oscar, reason="checked the preview")
    worker.process_one(Run.objects.get(pk=run.pk))
    actions.pause_run(Run.objects.get(pk=run.pk), actor=oscar, reason="INC-1 primary busy")

    client = client_for("viewer")
    page = client.get(reverse("runs:detail", args=[run.pk]))
    fragment = client.get(reverse("runs:detail", args=[run.pk]), HTTP_HX_REQUEST="true")

    assert (page.status_code, fragment.status_code) == (200, 200)
    assert 'ETA <span data-testid="eta">—</span>' in fragment.content.decode()  # paused


@pytest.fixture
def eventful_run(events_policy, make_user, settings) -> Run:
    """An active run with a legal hold on one tenant, a retried chunk and a split chunk,
    each made the way production makes it (a killed attempt is found by the next claim)."""
    run, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(run)
    place_hold(
        policy=events_policy, tenant="3", actor=make_user("hilda", "compliance"), reason="case 7"
    )
    killed = timezone.now() - timedelta(days=1)
    retried, split = Chunk.objects.filter(run=run, state="pending").order_by("seq", "id")[:2]

    floor = settings.RETENTION["SPLIT_FLOOR_ROWS"]
    settings.RETENTION = {**settings.RETENTION, "SPLIT_FLOOR_ROWS": 10**9}  # cannot split: retry
    Chunk.objects.filter(pk=retried.pk).update(claimed_at=killed)
    assert worker.process_one(run, chunk_id=retried.pk).kind == worker.DONE
    settings.RETENTION = {**settings.RETENTION, "SPLIT_FLOOR_ROWS": floor}
    Chunk.objects.filter(pk=split.pk).update(claimed_at=killed)
    worker.process_one(run, chunk_id=split.pk)
    for _ in range(8):
        worker.process_one(Run.objects.get(pk=run.pk))
    run.refresh_from_db()
    return run


def scrape(client) -> dict:
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_every_surface_reports_the_same_progress_for_a_run_with_holds_splits_and_retries(
    client_for, eventful_run
):
    from runs.progress import progress_for
    from runs.status import run_status

    run = eventful_run
    truth = progress_for([run.pk], now=timezone.now())[run.pk]
    # The run really has all three: otherwise this test proves little.
    assert truth.chunks["split"] >= 1
    assert truth.retries >= 1
    held = next(t for t in truth.tenants if t.tenant == "3")
    assert held.done >= 1 and held.rows_deleted == 0  # its chunks committed, deleting nothing
    assert truth.rows_planned > truth.rows_deleted > 0
    # Planned sizes are keys (upper bounds): the expected total is the admission count, not
    # their sum — capped by what the chunks can still delete (the held tenant's committed
    # chunks deleted nothing, so the count may be out of reach: "up to" then).
    most = truth.rows_deleted + truth.rows_outstanding
    assert truth.rows_expected == min(run.expected_rows, most) < truth.rows_planned
    bound = "up to" if run.expected_rows > most else "~"
    assert truth.expected_bound == bound
    expected = {
        "rows_deleted": truth.rows_deleted,
        "rows_expected": truth.rows_expected,
        "percent": truth.percent,
        "chunks_done": truth.chunks_done,
        "chunks_total": truth.chunks_total,
        "retries": truth.retries,
        "pending": truth.chunks["pending"],
        "split": truth.chunks["split"],
    }
    viewer = client_for("viewer")

    overview = viewer.get(reverse("home")).context
    (row,) = [r for r in overview["policy_rows"] if r["policy"].slug == "events"]
    p = row["progress"]
    seen = {
        "overview": {
            "rows_deleted": p.rows_deleted, "rows_expected": p.rows_expected,
            "percent": p.percent, "chunks_done": p.chunks_done, "chunks_total": p.chunks_total,
            "retries": p.retries, "pending": p.chunks["pending"], "split": p.chunks["split"],
        },
    }  # fmt: skip
    page = viewer.get(reverse("runs:detail", args=[run.pk]))
    p = page.context["progress"]
    seen["run page"] = {
        "rows_deleted": p.rows_deleted, "rows_expected": p.rows_expected, "percent": p.percent,
        "chunks_done": p.chunks_done, "chunks_total": p.chunks_total, "retries": p.retries,
        "pending": p.chunks["pending"], "split": p.chunks["split"],
    }  # fmt: skip
    html = page.content.decode()
    label = "~" if bound == "~" else f"{bound} "
    assert (
        f'<strong>{truth.percent}%</strong> · <span data-testid="rows-deleted">'
        f'{number(truth.rows_deleted)}</span> rows deleted of {label}<span data-testid="rows-expected">'
        f"{number(truth.rows_expected)}</span> expected · {number(truth.chunks_done)}/{number(truth.chunks_total)} chunks"
    ) in html
    assert ">Planned (up to)</th>" in html  # the tenant table's planned keys are upper bounds

    status = json.loads(json.dumps(run_status(run), default=str))
    seen["status"] = {
        "rows_deleted": status["rows_deleted"], "rows_expected": status["rows_expected"],
        "percent": status["percent"], "chunks_done": status["chunks_done"],
        "chunks_total": status["chunks_total"], "retries": status["retries"],
        "pending": status["chunks"]["pending"], "split": status["chunks"]["split"],
    }  # fmt: skip

    response = client_for("auditor").get(reverse("runs:manifest", args=[run.pk]))
    totals = json.loads(b"".join(response.streaming_content))["totals"]
    assert (totals["planned_rows_up_to"], totals["rows_expected_bound"]) == (
        truth.rows_planned,
        bound,
    )
    chunks = totals["chunks"]
    seen["manifest"] = {
        "rows_deleted": totals["rows_deleted"], "rows_expected": totals["rows_expected"],
        "percent": totals["percent"], "chunks_done": chunks["done"],
        "chunks_total": sum(n for s, n in chunks.items() if s != "split"),
        "retries": expected["retries"],  # the manifest lists attempts per chunk instead
        "pending": chunks["pending"], "split": chunks["split"],
    }  # fmt: skip

    m = scrape(viewer)
    labels = (("policy", "events"), ("run", run.run_key))
    state = lambda s: m.get(("retention_chunks", (("policy", "events"), ("state", s))), 0)  # noqa: E731
    seen["metrics"] = {
        "rows_deleted": m[("retention_run_rows_deleted", labels)],
        "rows_expected": m[("retention_run_rows_expected", labels)],
        "percent": m[("retention_run_progress_percent", labels)],
        "chunks_done": state("done"),
        "chunks_total": sum(state(s) for s in Chunk.State.values if s != "split"),
        "retries": m[("retention_chunk_retries", (("policy", "events"),))],
        "pending": state("pending"),
        "split": state("split"),
    }

    for surface, numbers in seen.items():
        assert numbers == expected, surface


def test_the_expected_total_is_the_admission_count_not_the_sum_of_planned_upper_bounds(run):
    """A chunk's planned size is the keys in its range (kept and young rows too): their sum is
    what the run can delete at most, shown as "up to"; the total is the admission count."""
    from runs.progress import progress_for

    p = progress_for([run.pk], now=timezone.now())[run.pk]

    pending_keys = sum(c.planned_rows for c in Chunk.objects.filter(run=run, state="pending"))
    assert p.planner_done and p.rows_pending == pending_keys
    assert p.rows_deleted + p.rows_outstanding > run.expected_rows  # the upper bound
    assert (p.rows_expected, p.expected_bound) == (run.expected_rows, "~")
    assert p.percent == 100 * p.rows_deleted // run.expected_rows < 100


def test_expected_rows_are_never_below_what_was_deleted_nor_above_what_the_chunks_hold(run):
    from runs.progress import progress_for

    Run.objects.filter(pk=run.pk).update(expected_rows=10)  # less than was deleted already
    p = progress_for([run.pk], now=timezone.now())[run.pk]
    assert p.rows_deleted > 10
    assert (p.rows_expected, p.expected_bound, p.percent) == (p.rows_deleted, "at least", 99)

    Run.objects.filter(pk=run.pk).update(expected_rows=10**6)  # more than the chunks can delete
    p = progress_for([run.pk], now=timezone.now())[run.pk]
    most = p.rows_deleted + p.rows_outstanding
    assert (p.rows_expected, p.expected_bound) == (most, "up to")

    Run.objects.filter(pk=run.pk).update(expected_rows=None)  # the count did not finish
    p = progress_for([run.pk], now=timezone.now())[run.pk]
    assert (p.rows_expected, p.expected_bound) == (most, "up to")


def test_while_planning_the_admission_count_is_the_total_and_a_floor_when_capped(fresh_run):
    from runs.progress import progress_for

    Run.objects.filter(pk=fresh_run.pk).update(planner_done=False, expected_rows=10**6)
    p = progress_for([fresh_run.pk], now=timezone.now())[fresh_run.pk]
    assert (p.rows_expected, p.expected_bound, p.percent) == (10**6, "~", 0)

    # held for confirmation: the count stopped at the blast-radius cap
    Run.objects.filter(pk=fresh_run.pk).update(held_at=timezone.now())
    p = progress_for([fresh_run.pk], now=timezone.now())[fresh_run.pk]
    assert (p.rows_expected, p.expected_bound, p.percent) == (10**6, "at least", 0)

    # no count at all: no total while the walk goes on (the planned keys are no bound of it)
    Run.objects.filter(pk=fresh_run.pk).update(expected_rows=None, held_at=None)
    p = progress_for([fresh_run.pk], now=timezone.now())[fresh_run.pk]
    assert (p.rows_expected, p.percent, p.eta_s) == (0, 0, None)


def test_a_drained_run_is_complete_and_has_no_eta(client_for, run):
    from runs.progress import progress_for

    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    p = progress_for([run.pk], now=timezone.now())[run.pk]

    assert (p.percent, p.eta_s, p.rows_expected) == (100, None, p.rows_deleted)
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert 'ETA <span data-testid="eta">—</span>' in html


def test_an_active_run_has_an_eta_from_its_own_recent_pace_that_moves_with_progress(run):
    from runs.progress import progress_for

    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    before = progress_for([run.pk], now=timezone.now())[run.pk]
    for _ in range(3):
        worker.process_one(Run.objects.get(pk=run.pk))
    after = progress_for([run.pk], now=timezone.now())[run.pk]

    assert before.eta_s is not None and after.eta_s is not None
    assert after.rows_deleted > before.rows_deleted
    to_go = after.rows_expected - after.rows_deleted - (after.rows_outstanding - after.rows_pending)
    # the commits span under ten seconds: only the recent pace counts, shown as a range
    soonest, latest = after.eta_range_s
    assert soonest < to_go / after.rate_per_s < latest
    assert latest == pytest.approx(soonest * ETA_SPREAD)
    assert after.eta_s == pytest.approx(to_go / after.rate_per_s)
    assert after.eta_s != before.eta_s


def test_the_eta_is_the_range_between_the_recent_and_the_whole_runs_pace(run, client_for):
    """A run whose first chunk took 30 s twenty minutes ago and the others committed in the
    last minute: its pace over the whole run and over the last ten minutes differ (each per
    second it was admitted: the twenty minutes between count for nothing), and the ETA is the
    range between them — the page shows both ends, and the middle moves with neither alone."""
    from runs.models import AuditRecord
    from runs.progress import progress_for
    from tests.security.test_audit_append_only import behind_the_trigger

    now = timezone.now()
    first = AuditRecord.objects.filter(run=run).order_by("chain_seq").first()
    behind_the_trigger(
        "UPDATE runs_auditrecord SET started_at = %s, committed_at = %s WHERE id = %s",
        [now - timedelta(minutes=20, seconds=30), now - timedelta(minutes=20), first.pk],
    )
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(minutes=21))
    p = progress_for([run.pk], now=now)[run.pk]
    to_go = p.rows_expected - p.rows_deleted - (p.rows_outstanding - p.rows_pending)
    assert to_go > 0
    assert 30 <= p.admitted_s < 40  # the first chunk's 30 s and the others' own time
    whole = p.rows_deleted / p.admitted_s
    fast, slow = max(whole, p.rate_per_s), min(whole, p.rate_per_s)
    assert fast > slow * ETA_SPREAD  # the paces differ more than the least spread
    assert p.eta_range_s == (pytest.approx(to_go / fast), pytest.approx(to_go / slow))
    assert p.eta_s == pytest.approx(math.sqrt((to_go / fast) * (to_go / slow)))

    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    shown = f"{duration(to_go / fast)} – {duration(to_go / slow)}"
    assert f'ETA <span data-testid="eta">{shown}</span>' in html
    assert p.as_dict()["eta_range_s"] == [round(to_go / fast), round(to_go / slow)]


def test_every_figure_is_an_int_or_a_float(run):
    from runs.progress import progress_for

    p = progress_for([run.pk], now=timezone.now())[run.pk]

    for name in ("rows_deleted", "rows_planned", "rows_expected", "rows_outstanding",
                 "rows_pending", "retries", "admissible", "percent", "audit_records"):  # fmt: skip
        assert type(getattr(p, name)) is int, name
    for name in ("rate_per_s", "eta_s", "queue_age_s", "last_commit_age_s"):
        assert getattr(p, name) is None or type(getattr(p, name)) is float, name
    for t in p.tenants:
        assert type(t.rows_deleted) is int and type(t.planned) is int
