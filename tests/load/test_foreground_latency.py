"""Under foreground pressure the guard throttles a drain, says why, and the run still drains.

Behaviour only: how many milliseconds the foreground waits with the guard on or off is a
measurement, printed by ``python -m bench.run`` ("fg p50 / p95 / p99 / max ms", docs/performance.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection
from django.db.models import Max, Min

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, create_events
from tests.runs.processes import spawn

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

BUDGET_MS = 50.0  # the policy's probe p95 threshold: its foreground budget
PRESSURE_S = 15  # at most this long a session holds the table against the foreground


def dsn() -> str:
    params = connection.get_connection_params()
    parts = [f"dbname={params['dbname']}", f"user={params.get('user') or 'postgres'}"]
    if params.get("host"):
        parts.append(f"host={params['host']}")
    if params.get("port"):
        parts.append(f"port={params['port']}")
    return " ".join(parts)


def wait_for(predicate, *, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_the_guard_throttles_under_foreground_pressure_says_why_and_the_run_still_drains(
    transactional_db, make_user
):
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
    seen: set[str] = set()

    def throttled_for_locks() -> bool:
        reasons = Chunk.objects.filter(run=run).exclude(throttle_reason="")
        seen.update(reasons.values_list("throttle_reason", flat=True))
        return any("waiting on locks of public.rr_events" in r for r in seen)

    try:
        load = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "load" / "foreground.py"), dsn(), "rr_events", "12", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        workers = [spawn("retention", "drain", run.run_key, "--until-idle") for _ in range(2)]
        assert wait_for(lambda: AuditRecord.objects.filter(run=run).exists(), timeout=60)
        # Pressure: a session holds the table so the foreground's inserts queue behind it.
        with psycopg.connect(dsn(), autocommit=True, application_name="pressure") as holder:
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE public.rr_events IN SHARE MODE")
            throttled = wait_for(throttled_for_locks, timeout=PRESSURE_S)
            holder.execute("ROLLBACK")
        out, err = load.communicate(timeout=120)
        assert load.returncode == 0, err
        for worker in workers:
            _, werr = worker.communicate(timeout=300)
            assert worker.returncode == 0, werr
        assert throttled, f"no chunk was throttled for the waiting sessions; reasons seen: {seen}"
        run.refresh_from_db()
        assert run.state == Run.State.DRAINED, run.state_reason  # it resumed by itself
        stats = json.loads(out)
        assert stats["count"] > 2000  # the foreground was served throughout
        span = run.audit_records.aggregate(s=Min("started_at"), e=Max("committed_at"))
        assert (span["e"] - span["s"]).total_seconds() >= 4, (
            "the drain must overlap the foreground load"
        )
        assert check_run(run, shadow=("public", "rr_events_shadow")) == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
