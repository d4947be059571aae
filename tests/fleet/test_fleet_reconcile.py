"""The reconciler's pass on every target: a target's lease whose worker was killed (and whose
message was lost) is published again without a new trigger, while a target that does not
answer is noted and skipped; a missed period is caught up (by the pass and by a late firing)
and a superseded period run again on each target of the policy; ``retention startup`` starts
a run on each."""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from retention.schedule_math import latest_tick
from runs.engine.reconciler import CATCH_UP_GRACE
from runs.evidence.audit import verify_chain
from runs.fleet import reconcile as fleet_reconcile
from runs.models import AuditRecord, Chunk, Lease, Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, backdate_approval, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import kill_group, spawn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = "retention_runner"
CLUSTER_ENV = {
    "Q_CLUSTER_NAME": "cleanup",
    "RETENTION_Q_TIMEOUT": "10",
    "RETENTION_Q_RETRY": "12",
    "RETENTION_LEASE_BUDGET_S": "2",
    "RETENTION_GUARD": "0",
}


def _runs(name: str) -> list[Run]:
    with C.on(name):
        return list(Run.objects.select_related("policy_version").order_by("id"))


def _eligible(target, cutoff) -> int:
    return target.scalar(
        "SELECT count(*) FROM public.rr_events WHERE occurred_at < %s AND status <> 'disputed'",
        [cutoff],
    )


@pytest.fixture
def gone(monkeypatch):
    """A registered target whose server does not answer (nothing listens on its port)."""
    monkeypatch.setenv("FLEET_TEST_DSN_GONE", "postgresql://postgres@127.0.0.1:9/none")
    return Target.objects.create(name="gone", dsn_env="FLEET_TEST_DSN_GONE", group="elsewhere")


def test_a_killed_workers_lease_on_a_target_is_published_again_by_the_reconciler(
    fleet, gone, make_user, act_as, settings
):
    settings.RETENTION = {**settings.RETENTION, "LEASE_STALE_S": 3}
    target = fleet[0]
    with C.on(target.name):
        create_events(6000, days=40)
    # one lease, paced: the worker is killed with most of the run still to do
    approved_policy(
        make_user,
        **events_spec(
            targets=[target.name], chunking="key", chunk_size=100, pace_rows_per_s=800,
            limits={"policy_workers": 1},
        ),
    )  # fmt: skip
    act_as(make_user("olga", "oncall"))
    (key,) = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert key.startswith(f"{target.name}:")
    records = f"SELECT count(*) FROM {SCHEMA}.runs_auditrecord"

    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(lambda: target.scalar(records) >= 3, timeout=120, what="a few chunks committed")
    finally:
        kill_group(cluster, signal.SIGKILL)  # the worker dies mid-lease
    # and its message is lost with it (a broker that forgot it): only the reconciler can
    # bring the run back
    OrmQ.objects.all().delete()
    done_before = target.scalar(records)
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        assert run.state == Run.State.ACTIVE
        generation = Lease.objects.get(run=run).generation

    reports = []

    def republished() -> bool:
        reports.append(json.loads(run_cli("reconcile")))
        return bool(reports[-1]["targets"].get(target.name, {}).get("republished"))

    wait_for(republished, timeout=60, interval=1, what=lambda: f"a re-publication ({reports[-1]})")
    report = reports[-1]
    # the target that does not answer was noted and skipped; the pass went on
    assert report["targets"]["gone"]["unreachable"], report
    assert Target.objects.get(name="gone").unreachable_since is not None
    with C.on(target.name):
        assert Lease.objects.get(run_id=run.pk).generation == generation + 1
    messages = [m.task for m in OrmQ.objects.all()]
    assert [m["kwargs"].get("target") for m in messages] == [target.name], messages
    assert target.scalar(records) == done_before  # the pass itself deleted nothing

    # a new worker, no new trigger: the published lease drains the run to the end
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: target.scalar(f"SELECT state FROM {SCHEMA}.runs_run") == "drained",
            timeout=240,
            interval=0.5,
            what="the run to drain",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
    (run,) = _runs(target.name)
    assert run.run_key == key
    assert _eligible(target, run.cutoff) == 0
    with C.on(target.name):
        assert (
            not Chunk.objects.filter(run=run)
            .exclude(state__in=(Chunk.State.DONE, Chunk.State.SPLIT))
            .exists()
        )
        deleted = sum(AuditRecord.objects.values_list("rows_deleted", flat=True))
        assert not verify_chain().problems
    assert deleted == target.scalar("SELECT 6000 - count(*) FROM public.rr_events") > 0
    assert not Run.objects.exists()  # nothing on the control database, which is no target


def test_a_missed_period_is_caught_up_on_every_target_of_the_group(fleet, gone, make_user):
    for target in fleet:
        with C.on(target.name):
            create_events(300, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=["group:shards"], catch_up="latest")
    )  # fmt: skip
    backdate_approval(policy, timezone.now() - timedelta(days=3), created_too=True)
    now = timezone.now()
    newest = latest_tick(policy, now - CATCH_UP_GRACE)

    report = fleet_reconcile.reconcile_everywhere(now)
    skipped = set()
    for target in fleet:
        (run,) = _runs(target.name)
        assert run.source == "catch-up"
        assert run.tick == newest
        assert run.run_key.startswith(f"{target.name}:events/")
        assert report["targets"][target.name]["caught_up"] == [run.run_key]
        assert len(run.skipped_ticks) >= 2  # three days missed: the older ticks recorded
        skipped.add(tuple(run.skipped_ticks))
    assert len(skipped) == 1  # each target missed the same ticks
    assert report["caught_up"] == [] and not Run.objects.exists()  # the control: no target
    assert "unreachable" in report["targets"]["gone"]

    # a second pass finds each target caught up
    again = fleet_reconcile.reconcile_everywhere(now)
    assert all(len(_runs(t.name)) == 1 for t in fleet)
    assert not any(again["targets"][t.name].get("caught_up") for t in fleet)


def test_a_superseded_period_runs_again_on_every_target(fleet, make_user, act_as, no_guard):
    for target in fleet:
        with C.on(target.name):
            create_events(300, days=40)
    approved_policy(make_user, **events_spec(targets=["group:shards"]))
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert len(keys) == len(fleet)
    # a new version is approved while the period's runs are open on every target
    policy = approved_policy(
        make_user, **events_spec(targets=["group:shards"], retention="25 days")
    )
    assert policy.approved_version.number == 2

    report = fleet_reconcile.reconcile_everywhere()
    for target, key in zip(fleet, keys, strict=True):
        old, new = _runs(target.name)
        assert (old.run_key, old.state, old.policy_version.number) == (key, "superseded", 1)
        assert (new.run_key, new.policy_version.number) == (f"{key}/v2", 2)
        assert new.tick == old.tick and new.state == Run.State.ACTIVE
        assert report["targets"][target.name]["superseded"] == [key]
        assert report["targets"][target.name]["rerun"] == [new.run_key]
    assert not Run.objects.exists()


def test_startup_starts_a_run_on_every_target_where_the_policy_has_none(fleet, make_user):
    for target in fleet:
        with C.on(target.name):
            create_events(300, days=40)
    approved_policy(make_user, **events_spec(targets=["group:shards"]))
    first = run_cli("startup").splitlines()
    started = [line.split()[1] for line in first if line.startswith("started ")]
    assert [k.split(":")[0] for k in started] == [t.name for t in fleet], first
    for target, key in zip(fleet, started, strict=True):
        assert [r.run_key for r in _runs(target.name)] == [key]
    assert not Run.objects.exists()
    # a second start-up finds a run everywhere and starts none
    assert not [line for line in run_cli("startup").splitlines() if line.startswith("started ")]
    assert all(len(_runs(t.name)) == 1 for t in fleet)


def test_a_late_firing_catches_up_on_every_target_of_the_group(fleet, make_user):
    from runs.tasks import trigger_scheduled

    for target in fleet:
        with C.on(target.name):
            create_events(300, days=40)
    policy = approved_policy(
        make_user, **events_spec(targets=["group:shards"], catch_up="latest")
    )  # fmt: skip
    backdate_approval(policy, timezone.now() - timedelta(days=3), created_too=True)
    late_tick = latest_tick(policy, timezone.now() - timedelta(days=2))

    outcome = trigger_scheduled(policy_id=policy.pk, tick=late_tick.isoformat())
    keys = []
    for target in fleet:
        (run,) = _runs(target.name)
        assert run.source == "catch-up" and run.tick > late_tick
        keys.append(run.run_key)
    assert outcome.count("caught up with run") == len(fleet), outcome
    assert all(key in outcome for key in keys), outcome
    assert not Run.objects.exists()
