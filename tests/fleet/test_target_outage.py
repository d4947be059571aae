"""A target whose server dies mid-run: its run needs attention naming it, the other target
drains; when the server is back the same run resumes and finishes exactly."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection

from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, Chunk, Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, events_spec
from tests.fleet import servers
from tests.fleet.conftest import TargetDb, migrate_url, run_cli
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 12000


@pytest.fixture
def killable(fleet, monkeypatch):
    """A fourth target on an embedded server of its own, which this test may stop."""
    server = servers.embedded("fleet-kill")
    database = server.create_database(template=server.ledger_template(migrate_url))
    target = TargetDb("doomed", "FLEET_TEST_DSN_DOOMED", server.admin_url(database), server,
                      database)  # fmt: skip
    monkeypatch.setenv(target.env, target.url)
    Target.objects.create(name=target.name, dsn_env=target.env, group="pair")
    yield target
    C.close_all()
    server.start()
    server.drop_database(database)


def _snapshot(cutoff) -> tuple[set, set]:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_events")
        ids = {r[0] for r in cur.fetchall()}
        cur.execute(
            "SELECT id FROM public.rr_events WHERE occurred_at < %s AND status <> 'disputed'",
            [cutoff],
        )
        return ids, {r[0] for r in cur.fetchall()}


def _left() -> set:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_events")
        return {r[0] for r in cur.fetchall()}


def test_a_target_killed_mid_run_needs_attention_and_resumes_exactly(
    fleet, killable, make_user, act_as, no_guard, settings
):
    settings.RETENTION = {**settings.RETENTION, "LEASE_BUDGET_S": 5}
    other = fleet[1]
    Target.objects.filter(name=other.name).update(group="pair")
    for name in (killable.name, other.name):
        with C.on(name):
            create_events(ROWS, days=40)
    approved_policy(
        make_user, **events_spec(targets=["group:pair"], chunking="key", chunk_size=100)
    )
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert [k.split(":")[0] for k in keys] == ["doomed", other.name]
    doomed_key, other_key = keys
    snapshots = {}
    for name, key in ((killable.name, doomed_key), (other.name, other_key)):
        with C.on(name):
            snapshots[name] = _snapshot(Run.objects.get(run_key=key).cutoff)

    # a drain of the doomed target alone, in another thread; its server dies once a few of
    # its chunks have committed
    drained: dict = {}

    def drain_doomed() -> None:
        try:
            drained["out"] = run_cli("drain", doomed_key, "--until-idle", "--budget", "2")
        except BaseException as exc:  # noqa: BLE001 - looked at below
            drained["error"] = exc

    thread = threading.Thread(target=drain_doomed)
    thread.start()
    deadline = time.monotonic() + 120
    while killable.scalar("SELECT count(*) FROM retention_runner.runs_auditrecord") < 3:
        assert time.monotonic() < deadline, "the doomed target's drain never committed a chunk"
        time.sleep(0.05)
    killable.server.stop("immediate")
    thread.join(120)
    assert not thread.is_alive()
    assert "error" not in drained, drained

    # the other target drains meanwhile; the doomed one is named, nothing else fails
    run_cli("drain", "--until-idle", "--workers", "2")
    status = json.loads(run_cli("status", other_key, "--json"))
    assert status["state"] == "drained"
    down = json.loads(run_cli("status", doomed_key, "--json"))
    assert down["state"] == "attention"
    assert down["target"] == "doomed"
    assert down["state_reason"].startswith("target doomed is unreachable")
    assert Target.objects.get(name="doomed").unreachable_since is not None

    # back: the same run resumes where its ledger says and finishes exactly
    killable.server.start()
    C.close_all()
    with C.on("doomed"):
        run = Run.objects.get(run_key=doomed_key)
        assert run.state == Run.State.ACTIVE
        assert Chunk.objects.filter(run=run, state=Chunk.State.DONE).exists()
        run_id = run.pk
    run_cli("drain", "--until-idle")
    status = json.loads(run_cli("status", doomed_key, "--json"))
    assert status["state"] == "drained", status
    assert Target.objects.get(name="doomed").unreachable_since is None
    for name in (killable.name, other.name):
        ids, eligible = snapshots[name]
        with C.on(name):
            assert _left() == ids - eligible
            assert sum(AuditRecord.objects.values_list("rows_deleted", flat=True)) == len(eligible)
            assert not verify_chain().problems
            assert Run.objects.count() == 1
    with C.on("doomed"):
        assert Run.objects.get().pk == run_id
