from __future__ import annotations

from runs.engine.explain import explain
from tests.runs.conftest import count


def test_explain_shows_every_engine_statement_and_deletes_nothing(events_policy):
    before = count("rr_events")
    plans = dict(explain(events_policy))
    assert list(plans) == [
        "planner: eligible key bounds",
        "planner: distinct tenants (loose index scan)",
        "planner: one window (chunk boundaries from the key index)",
        "worker: chunk DELETE (rolled back)",
        "reconciler: verification (remaining, held, NULL rows in one statement)",
    ]
    delete_plan = "\n".join(plans["worker: chunk DELETE (rolled back)"])
    assert "Delete on rr_events" in delete_plan
    assert (
        "Anti Join" in delete_plan or "SubPlan" in delete_plan
    )  # the hold test is in the statement
    # the verification as the reconciler runs it: one statement, by a bitmap scan of the
    # timestamp index (runs.engine.reconciler.bitmap_scan)
    verify_plan = "\n".join(
        plans["reconciler: verification (remaining, held, NULL rows in one statement)"]
    )
    assert "Bitmap Heap Scan on rr_events" in verify_plan
    assert all("Buffers" in "\n".join(lines) for lines in plans.values())
    assert count("rr_events") == before
