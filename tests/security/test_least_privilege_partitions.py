"""A least-privilege worker role (`retention grants apply --worker`) on a partitioned table: it owns
nothing, so it cannot detach or drop a partition — the run deletes every old row in chunks,
drains and passes the invariant checker; no partition is touched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, PartitionAction, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, count, worker_env
from tests.runs.test_partitions import EXPIRED, MONTHS, create_partitioned
from tests.security.roles import apply_grants, url_as

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def parts_run(make_user):
    create_partitioned()
    policy = approved_policy(
        make_user, **events_spec(slug="parts", table="rr_parts", retention="120 days", keep=[])
    )
    run, _ = trigger_run(policy, tick=NOW)
    yield run
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def test_a_worker_role_that_does_not_own_the_table_deletes_its_partitions_in_chunks(
    parts_run, worker_role
):
    role, password = worker_role
    apply_grants("worker", role, "public.rr_parts")
    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password),
           "RETENTION_GUARD": "0"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "manage.py", "retention", "drain", parts_run.run_key, "--until-idle",
         "--budget", "60"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parts_run.refresh_from_db()
    assert parts_run.state == Run.State.DRAINED, parts_run.state_reason
    assert not PartitionAction.objects.filter(run=parts_run).exists()
    assert not AuditRecord.objects.filter(run=parts_run, partition__isnull=False).exists()
    for month in EXPIRED:
        assert count(f"public.rr_parts_{month}") == 0  # still there, emptied by chunks
    assert check_run(parts_run, shadow=("public", "rr_parts_shadow")) == []
