"""``retention grants apply --target-db NAME`` gives a target's worker login exactly what it
needs in that target's ledger — the ledger, the mirror of the control database's decisions it
syncs, SELECT and DELETE on the policy's table — and a real least-privilege login drains a run
there with it; ``retention grants check`` checks every target and names the target and the
privilege it lacks."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from retention import actions as policy_actions
from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, Checkpoint, Run
from targets import connections as C
from tests import zygote
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, ROOT, create_events, worker_env

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _as_login(url: str, role: str) -> str:
    return re.sub(r"^postgresql://[^@/]*@", f"postgresql://{role}@", url)


@pytest.fixture
def target_worker(fleet):
    """A login with nothing on the second server (its own embedded PostgreSQL): the target's
    worker login, dropped afterwards."""
    target = fleet[1]
    role = f"rr_tw_{uuid.uuid4().hex[:10]}"
    with target.connect() as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    yield target, role
    C.close_all()
    with target.connect() as conn:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def _check(*args: str) -> tuple[bool, str]:
    from io import StringIO

    out = StringIO()
    try:
        call_command("retention", "grants", "check", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def test_a_target_worker_login_drains_with_what_grants_apply_gives_it_and_check_names_a_gap(
    target_worker, make_user, act_as, no_guard
):
    target, role = target_worker
    with C.on(target.name):
        create_events(1200, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=[target.name], chunking="key", chunk_size=300)
    )

    out = run_cli("grants", "apply", "--target-db", target.name, "--worker", role)
    assert f"{role}: granted what the worker login needs in target {target.name}'s ledger" in out
    ok, out = _check("--target-db", target.name, "--worker", role)
    assert ok, out
    assert f"target {target.name}: {role} (worker): exactly what it needs" in out

    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    # a hold placed after the trigger synced the mirror: the worker login brings it there
    policy_actions.place_hold(
        actor=make_user("hilde", "compliance"), reason="litigation", policy=policy, tenant="3"
    )
    # a worker process whose connection to the target is the least-privilege login: it syncs
    # the mirror of the decisions, claims, deletes, appends the audit rows there
    env = {
        **os.environ,
        **worker_env(),
        "RETENTION_GUARD": "0",
        target.env: _as_login(target.url, role),
    }
    done = zygote.run(
        [sys.executable, "manage.py", "retention", "drain", "--until-idle", "--budget", "60"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads(run_cli("status", key, "--json"))
    assert status["state"] == "drained", status
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        assert AuditRecord.objects.filter(run=run).count() > 0
        assert not verify_chain().problems
        # the hold reached the mirror, written by the worker login, and kept tenant 3's rows
        assert (
            target.scalar(
                "SELECT count(*) FROM retention_runner.retention_legalhold WHERE tenant = '3'"
            )
            == 1
        )
        assert (
            target.scalar(
                "SELECT count(*) FROM public.rr_events WHERE tenant_id = 3 AND occurred_at < %s",
                [run.cutoff],
            )
            > 0
        )

    # a grant taken away on that target: check names the target and the privilege
    with target.connect() as conn:
        conn.execute(f'REVOKE INSERT ON retention_runner.retention_legalhold FROM "{role}"')
    ok, out = _check("--worker", role)  # every target: the control database and the three
    assert not ok
    assert (
        f"  target {target.name}: missing: INSERT on retention_runner.retention_legalhold" in out
    ), out
    for other in ("shard1", "shard3"):  # the login exists on no other server
        assert f"  target {other}: no such role {role}" in out, out
    assert f"  no such role {role}" in out  # the control database


def test_the_checkpoint_job_signs_a_target_with_the_monitor_login_grants_apply_gives_it(
    target_worker,
):
    """The target's monitor login reads its chains' heads and its WAL position, nothing more;
    the anchor is stored in the control database."""
    target, role = target_worker
    out = run_cli("grants", "apply", "--target-db", target.name, "--monitor", role)
    assert f"{role}: granted what the monitor login needs in target {target.name}'s ledger" in out
    ok, out = _check("--target-db", target.name, "--monitor", role)
    assert ok and f"target {target.name}: {role} (monitor): exactly what it needs" in out, out

    env = {
        **os.environ,
        **worker_env(),
        "RETENTION_EVIDENCE_KEY": "evidence-key-kept-off-the-database-host-0123456789",
        target.env: _as_login(target.url, role),
    }
    done = zygote.run(
        [sys.executable, "manage.py", "retention", "audit", "checkpoint"],
        cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    # the other targets' variables point at their servers' superuser: signed too; this one
    # with the monitor login alone
    assert done.returncode == 0, done.stderr[-3000:]
    signed = json.loads(done.stdout)["anchors"]
    assert target.name in [a.get("target") for a in signed]
    assert Checkpoint.objects.filter(target=target.name).count() == 1
    # and it may write nothing there
    with psycopg.connect(_as_login(target.url, role), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO retention_runner.runs_checkpoint (at, audit_seq, audit_hash,"
                         " operator_seq, operator_hash, hmac, host) VALUES"
                         " (now(), 0, '', 0, '', 'x', 'monitor')")  # fmt: skip


def test_a_grant_missing_on_a_target_stops_its_drain_and_its_run_says_so(
    target_worker, make_user, act_as, no_guard
):
    """The worker login cannot bring a new hold into the target's mirror (its INSERT there
    taken away): the drain stops at once instead of retrying for ever, nothing is deleted
    without the hold, and the run needs attention naming the target and the grant."""
    target, role = target_worker
    with C.on(target.name):
        create_events(600, days=40)
    policy = approved_policy(make_user, **events_spec(targets=[target.name], chunking="key"))
    run_cli("grants", "apply", "--target-db", target.name, "--worker", role)
    with target.connect() as conn:
        conn.execute(f'REVOKE INSERT ON retention_runner.retention_legalhold FROM "{role}"')
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    policy_actions.place_hold(
        actor=make_user("hilde", "compliance"), reason="litigation", policy=policy, tenant="3"
    )
    with C.on(target.name):
        rows_before = target.scalar("SELECT count(*) FROM public.rr_events")
    env = {
        **os.environ,
        **worker_env(),
        "RETENTION_GUARD": "0",
        target.env: _as_login(target.url, role),
    }
    # no --budget: a drain that retried this for ever would never return
    done = zygote.run(
        [sys.executable, "manage.py", "retention", "drain", "--until-idle"],
        cwd=ROOT, env=env, timeout=240,
    )  # fmt: skip
    assert f"{target.name}" in done.stdout + done.stderr, (done.stdout, done.stderr[-2000:])
    assert target.scalar("SELECT count(*) FROM public.rr_events") == rows_before
    status = json.loads(run_cli("status", key, "--json"))
    assert status["state"] == "attention", status
    assert status["state_reason"].startswith(
        f"target {target.name} is unreachable: the login lacks a grant (`retention grants check`):"
        " permission denied"
    ), status
