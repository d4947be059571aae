"""A run's ETA and total while it drains (runs.progress): the pace is per second the run was
admitted, so a pause, the kill switch or a guard throttling it to zero does not make it look
slow; the range narrows as it proceeds; and a chunk committing while the figures are read
never makes the chunk count or the expected total dip for one reading."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from core.formatting import duration
from runs import progress
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import AuditRecord, Run
from runs.progress import progress_for
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.security.test_audit_append_only import behind_the_trigger


def space_out(run: Run, *, start, gap_after: int | None = None, stopped=timedelta(0)) -> None:
    """Rewrite the run's audit records' times as a steady pace: each chunk 1.5 s, the next
    beginning 0.5 s after the previous commit — and, after the ``gap_after``-th record, the
    run stopped for ``stopped`` (paused, the kill switch on) before the next chunk began."""
    at = start
    for i, record in enumerate(AuditRecord.objects.filter(run=run).order_by("chain_seq")):
        behind_the_trigger(
            "UPDATE runs_auditrecord SET started_at = %s, committed_at = %s WHERE id = %s",
            [at, at + timedelta(seconds=1.5), record.pk],
        )
        at += timedelta(seconds=2)
        if gap_after is not None and i + 1 == gap_after:
            at += stopped
    Run.objects.filter(pk=run.pk).update(started_at=start - timedelta(seconds=1))


def to_go(p) -> int:
    return p.rows_expected - p.rows_deleted - (p.rows_outstanding - p.rows_pending)


def process(run: Run, n: int) -> None:
    with override_settings(RETENTION={**settings.RETENTION, "GUARD": False}):
        for _ in range(n):
            assert worker.process_one(Run.objects.get(pk=run.pk)).kind == worker.DONE


def test_the_eta_counts_only_the_time_the_run_was_admitted(run, client_for):
    """Six chunks at a steady pace of 2 s each, with the run stopped for five minutes after
    the third: the pace is the rows over the 11 s it worked (1.5 s for each chunk that began
    after a stop, 2 s for each that followed a commit), not over the five minutes and more
    since it began — the ETA is what the run needs once it is admitted again."""
    process(run, 3)
    now = timezone.now()
    space_out(run, start=now - timedelta(minutes=6), gap_after=3, stopped=timedelta(minutes=5))
    p = progress_for([run.pk], now=now)[run.pk]

    assert p.audit_records == 6
    assert p.admitted_s == pytest.approx(11.0)
    assert p.rate_per_s == pytest.approx(p.rows_deleted / 11.0)
    expected = to_go(p) / (p.rows_deleted / 11.0)
    soonest, latest = p.eta_range_s
    assert soonest < expected < latest
    assert latest == pytest.approx(soonest * progress.ETA_SPREAD)
    # the page, status --json and /metrics read the same figures
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert f'ETA <span data-testid="eta">{duration(soonest)} – {duration(latest)}</span>' in html
    assert p.as_dict()["eta_range_s"] == [round(soonest), round(latest)]


def test_a_run_never_stopped_is_paced_over_its_whole_span(run):
    """The same six chunks without a stop: the admitted time is the span from the first
    chunk's start to the last commit, and the pace the same as with the stop."""
    process(run, 3)
    now = timezone.now()
    space_out(run, start=now - timedelta(seconds=30))
    p = progress_for([run.pk], now=now)[run.pk]

    assert p.admitted_s == pytest.approx(11.5)
    assert p.rate_per_s == pytest.approx(p.rows_deleted / 11.5)


def test_the_eta_range_narrows_as_the_run_proceeds(run):
    """At the same steady pace, the range after nine chunks is narrower than after three,
    and both contain the time the rows still to go take at that pace."""
    now = timezone.now()
    space_out(run, start=now - timedelta(seconds=30))
    early = progress_for([run.pk], now=now, remembered=False)[run.pk]
    process(run, 6)
    space_out(run, start=now - timedelta(seconds=30))
    later = progress_for([run.pk], now=now, remembered=False)[run.pk]

    assert later.rows_deleted > early.rows_deleted
    for p in (early, later):
        soonest, latest = p.eta_range_s
        assert soonest <= to_go(p) / p.rate_per_s <= latest
    width = [p.eta_range_s[1] - p.eta_range_s[0] for p in (early, later)]
    assert width[1] < width[0]


@pytest.fixture
def committed_run(transactional_db, make_user):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    process(created, 2)
    yield Run.objects.get(pk=created.pk)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events")


def test_a_chunk_committing_while_progress_is_read_is_counted_once(committed_run, monkeypatch):
    """Another worker commits a chunk between the read of the audit trail and the read of the
    chunks not done: the reading still counts every chunk once (done or pending, as of one
    moment), so the chunk count and the expected total stay what they were."""
    run = committed_run
    before = progress_for([run.pk], now=timezone.now())[run.pk]
    read_trail = progress.audit_tallies

    def commit_one():
        try:
            process(run, 1)
        finally:
            connection.close()

    def trail_then_a_commit(*args, **kwargs):
        out = read_trail(*args, **kwargs)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(commit_one).result()
        return out

    monkeypatch.setattr(progress, "audit_tallies", trail_then_a_commit)
    during = progress_for([run.pk], now=timezone.now())[run.pk]
    monkeypatch.undo()
    after = progress_for([run.pk], now=timezone.now())[run.pk]

    assert after.chunks_done == before.chunks_done + 1
    assert during.chunks_total == before.chunks_total == after.chunks_total
    assert during.chunks_done == before.chunks_done  # as of the moment the reading began
    assert during.rows_expected == before.rows_expected
