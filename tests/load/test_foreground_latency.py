"""With the guard on, foreground p99 during a drain stays within the policy's budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import connection
from django.db.models import Max, Min

from runs.actions import trigger_run
from runs.invariants import check_run
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events
from tests.runs.processes import spawn

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

BUDGET_MS = 50.0  # the policy's probe p95 threshold is its foreground budget


def dsn() -> str:
    params = connection.get_connection_params()
    parts = [f"dbname={params['dbname']}", f"user={params.get('user') or 'postgres'}"]
    if params.get("host"):
        parts.append(f"host={params['host']}")
    if params.get("port"):
        parts.append(f"port={params['port']}")
    return " ".join(parts)


def test_foreground_p99_stays_within_budget_while_a_guarded_drain_runs(transactional_db, make_user):
    create_events(60000, tenants=6)
    policy = approved_policy(
        make_user,
        **events_spec(
            keep=[],
            chunk_size=500,
            guard={"probe_p95_ms": BUDGET_MS},
            pace_rows_per_s=4000,  # spread the drain over most of the load window
        ),
    )
    run, _ = trigger_run(policy, tick=NOW)
    try:
        load = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "load" / "foreground.py"), dsn(), "rr_events", "12", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        workers = [spawn("retention", "drain", run.run_key, "--until-idle") for _ in range(2)]
        out, err = load.communicate(timeout=120)
        assert load.returncode == 0, err
        for worker in workers:
            _, werr = worker.communicate(timeout=300)
            assert worker.returncode == 0, werr
        stats = json.loads(out)
        span = run.audit_records.aggregate(s=Min("started_at"), e=Max("committed_at"))
        assert (span["e"] - span["s"]).total_seconds() >= 4, (
            "the drain must overlap the foreground load"
        )
        run.refresh_from_db()
        assert run.state == Run.State.DRAINED, run.state_reason
        assert stats["count"] > 2000
        assert stats["p99"] <= BUDGET_MS, stats
        assert check_run(run, shadow=("public", "rr_events_shadow")) == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
