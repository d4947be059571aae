"""The worker login (`retention grants apply --worker`) on a partitioned table owns nothing.
With the table owner's partition function (created by `grants apply` as that owner) it takes
expired partitions whole through that function only — which refuses, inside the database, a
partition that is not expired, not the policy's, or not detached by a run, and a run whose
cutoff the approved retention does not allow; without the function it deletes every old row in
chunks. Either way the run drains and passes the invariant checker."""

from __future__ import annotations

import io
import os
import sys

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from runs.actions import trigger_run
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, PartitionAction, Run
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT, count, worker_env
from tests.runs.test_partitions import EXPIRED, MONTHS, create_partitioned
from tests.security.roles import apply_grants, connect_as, url_as

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


def test_a_worker_role_without_the_partition_function_deletes_its_partitions_in_chunks(
    parts_run, worker_role
):
    role, password = worker_role
    apply_grants("worker", role, "public.rr_parts")
    with connection.cursor() as cur:  # the table's owner never created the function
        cur.execute("DROP FUNCTION public.retention_runner_partition(text, bigint, regclass)")
    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password),
           "RETENTION_GUARD": "0"}  # fmt: skip
    result = zygote.run(
        [sys.executable, "manage.py", "retention", "drain", parts_run.run_key, "--until-idle",
         "--budget", "60"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parts_run.refresh_from_db()
    assert parts_run.state == Run.State.DRAINED, parts_run.state_reason
    assert not PartitionAction.objects.filter(run=parts_run).exists()
    assert not AuditRecord.objects.filter(run=parts_run, partition__isnull=False).exists()
    for month in EXPIRED:
        assert count(f"public.rr_parts_{month}") == 0  # still there, emptied by chunks
    assert check_run(parts_run, shadow=("public", "rr_parts_shadow")) == []


@pytest.fixture
def app_owner(parts_run):
    """The application's own role owns the partitioned table and its partitions (not the
    product's owner), and may create in its schema, as an application's owner does."""
    role = f"rr_app_owner_{os.getpid()}"
    with connection.cursor() as cur:
        cur.execute(f'CREATE ROLE "{role}" NOLOGIN')
        cur.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
        for table in ["rr_parts", *[f"rr_parts_{m}" for m in MONTHS]]:
            cur.execute(f'ALTER TABLE public.{table} OWNER TO "{role}"')
    yield role
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")
        cur.execute(f'DROP OWNED BY "{role}"')
        cur.execute(f'DROP ROLE "{role}"')


def test_the_worker_login_drops_expired_partitions_through_the_owners_function_alone(
    parts_run, app_owner, worker_role
):
    role, password = worker_role
    out = apply_grants("worker", role, "public.rr_parts")
    assert "could not create" not in out and "creates the partition function" not in out
    check = io.StringIO()
    call_command(
        "retention", "grants", "check", "--worker", role, "--target", "public.rr_parts",
        stdout=check,
    )  # fmt: skip
    assert f"{role} (worker): exactly what it needs" in check.getvalue()
    env = {**os.environ, **worker_env(), "DATABASE_URL": url_as(role, password),
           "RETENTION_GUARD": "0"}  # fmt: skip
    result = zygote.run(
        [sys.executable, "manage.py", "retention", "drain", parts_run.run_key, "--until-idle",
         "--budget", "60"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parts_run.refresh_from_db()
    assert parts_run.state == Run.State.DRAINED, parts_run.state_reason
    dropped = set(
        PartitionAction.objects.filter(run=parts_run, state="dropped").values_list(
            "name", flat=True
        )
    )
    # every expired month without a kept row went whole (March holds 'disputed' rows)
    assert dropped and dropped <= {f"rr_parts_{m}" for m in EXPIRED}
    with connection.cursor() as cur:
        for name in dropped:
            cur.execute("SELECT to_regclass(%s)", [f"public.{name}"])
            assert cur.fetchone()[0] is None, name
    assert AuditRecord.objects.filter(run=parts_run, partition__isnull=False).count() == len(
        dropped
    )
    assert check_run(parts_run, shadow=("public", "rr_parts_shadow")) == []


def test_the_partition_function_refuses_what_no_approved_run_may_take(
    parts_run, app_owner, worker_role
):
    role, password = worker_role
    apply_grants("worker", role, "public.rr_parts")
    function = "public.retention_runner_partition"
    young, old = "public.rr_parts_2026_11", "public.rr_parts_2026_01"
    with connect_as(role, password) as conn:
        attempts = {
            "a partition younger than the cutoff": (
                f"SELECT {function}('detach', %s, %s::regclass)", [parts_run.pk, young]),
            "dropping a partition still attached": (
                f"SELECT {function}('drop', %s, %s::regclass)", [parts_run.pk, old]),
            "dropping the shadow table (not detached by a run)": (
                f"SELECT {function}('drop', %s, 'public.rr_parts_shadow'::regclass)",
                [parts_run.pk]),
            "the policy's table itself": (
                f"SELECT {function}('detach', %s, 'public.rr_parts'::regclass)", [parts_run.pk]),
            "DROP TABLE directly": (f"DROP TABLE {old}", []),
            "DETACH directly": (f"ALTER TABLE public.rr_parts DETACH PARTITION {old}", []),
        }  # fmt: skip
        for what, (statement, params) in attempts.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement, params)
                pytest.fail(f"{what} was not refused")
        # a run the worker login wrote itself, with a cutoff of now: more than the approved
        # retention allows, so not even an expired partition goes for it
        forged = conn.execute(
            "INSERT INTO runs_run SELECT (jsonb_populate_record(NULL::runs_run, to_jsonb(r)"
            " || jsonb_build_object('id', r.id + 100000, 'run_key', 'forged', 'tick', now(),"
            " 'cutoff', now()))).* FROM runs_run r WHERE r.id = %s RETURNING id",
            [parts_run.pk],
        ).fetchone()[0]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="later than retention"):
            conn.execute(f"SELECT {function}('detach', %s, %s::regclass)", [forged, old])
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.rr_parts'::regclass"
        )
        assert cur.fetchone()[0] == len(MONTHS)  # nothing was detached
