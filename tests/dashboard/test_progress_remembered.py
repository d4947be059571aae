"""Progress remembers what cannot change (runs.progress): a run's audit sums up to its last
record read, and a finished run's chunk sums. A reading after more chunks committed, after the
remembered record vanished, or of a finished run says exactly what a reading from scratch says."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Chunk
from runs.progress import AUDIT_TALLY_KEY, progress_for
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db


def figures(run_id: int) -> tuple:
    p = progress_for([run_id], now=timezone.now())[run_id]
    tenants = [(t.tenant, t.rows_deleted, t.chunks, t.done, t.planned) for t in p.tenants]
    return (p.as_dict(), p.audit_records, p.first_commit, p.last_commit, tenants)


def from_scratch(run_id: int) -> tuple:
    cache.delete(AUDIT_TALLY_KEY.format(run_id))
    return figures(run_id)


def test_a_reading_after_more_chunks_committed_equals_one_from_scratch(run):
    first = figures(run.pk)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    again = figures(run.pk)

    assert again[0]["rows_deleted"] > first[0]["rows_deleted"]
    assert again == from_scratch(run.pk)
    # the done chunks, summed from their audit records, are the chunks marked done
    done = Chunk.objects.filter(run=run, state=Chunk.State.DONE)
    assert again[0]["chunks_done"] == done.count()
    per_tenant = dict(done.values_list("tenant").annotate(n=Count("*")))
    assert {t: n for t, _rows, _chunks, n, _planned in again[4] if n} == per_tenant
    by_keys = dict(done.values_list("tenant").annotate(keys=Sum("planned_rows")))
    pending = Chunk.objects.filter(run=run).exclude(state__in=["done", "split"])
    pending_keys = dict(pending.values_list("tenant").annotate(keys=Sum("planned_rows")))
    assert {t: planned for t, _r, _c, _n, planned in again[4]} == {
        t: by_keys.get(t, 0) + pending_keys.get(t, 0) for t in {*by_keys, *pending_keys}
    }


def test_rows_of_chunks_across_tenants_move_to_their_tenants_read_after_read(make_user):
    create_events(3000, name="rr_keyed")
    policy = approved_policy(
        make_user, **events_spec(slug="keyed", table="rr_keyed", chunking="key")
    )
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    readings = []
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
        readings.append(figures(run.pk))

    tenants = readings[-1][4]
    assert len([t for t in tenants if t[1]]) > 1  # the chunks' rows are spread over tenants
    assert readings[-1] == from_scratch(run.pk)
    assert readings[0][0]["rows_deleted"] < readings[-1][0]["rows_deleted"]


def test_sums_remembered_for_a_record_that_is_gone_are_computed_again(run):
    truth = figures(run.pk)
    remembered = cache.get(AUDIT_TALLY_KEY.format(run.pk))
    assert remembered["seq"] > 0
    # a restored database: the remembered record is not the one there now
    remembered.update(hash="0" * 64, tenants={"1": [10**9, 1, None, None]})
    cache.set(AUDIT_TALLY_KEY.format(run.pk), remembered, None)

    assert figures(run.pk) == truth


def test_a_finished_runs_chunks_are_counted_once(run):
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.is_terminal
    counted = figures(run.pk)

    with CaptureQueriesContext(connection) as captured:
        remembered = figures(run.pk)

    assert remembered == counted
    assert remembered[0]["chunks_done"] > 0
    grouped = [q["sql"] for q in captured.captured_queries if "GROUP BY" in q["sql"]]
    assert not [sql for sql in grouped if 'FROM "runs_chunk"' in sql]
