"""The reconciler under a real cleanup cluster with a lowered task timeout: one policy's slow
or locked table never holds back another policy's reconciliation."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

from runs.models import Run
from tests.liveness.conftest import CLUSTER_ENV, drop_tables, policy_on
from tests.runs.processes import kill_group, pg_connect, spawn, task_outcomes, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


RECONCILE_TASKS: list[str] = []


def enqueue_reconcile() -> None:
    from django_q.tasks import async_task

    RECONCILE_TASKS.append(async_task("runs.tasks.reconcile", cluster="cleanup"))


def reconcile_passes() -> list[tuple[bool, object]]:
    """(success, result) of every finished reconciler task this module enqueued."""
    return [(t.success, t.result) for t in task_outcomes(RECONCILE_TASKS, "cleanup").values()]


def test_a_locked_table_does_not_stop_another_policys_catch_up(make_user):
    # "alpha" comes first in every order the policies are read in; its table is locked
    policy_on(make_user, "alpha", "rr_alpha", approved_ago=timedelta(days=3))
    beta = policy_on(make_user, "beta", "rr_beta", approved_ago=timedelta(days=3))
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_alpha IN ACCESS EXCLUSIVE MODE")
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        deadline = time.monotonic() + 25  # the lock is held all along (6 s task timeout)

        def beta_caught_up():
            if not Run.objects.filter(policy=beta, source="catch-up").exists():
                if time.monotonic() < deadline:
                    enqueue_reconcile()
                return False
            return True

        enqueue_reconcile()
        wait_for(beta_caught_up, timeout=30, interval=2, what="beta's catch-up run")
        # and no reconciler task ever reached the task timeout
        wait_for(
            lambda: any(success for success, _ in reconcile_passes()),
            timeout=20,
            what="a reconciler pass to finish",
        )
        failed = [str(result)[:300] for success, result in reconcile_passes() if not success]
        assert not failed, failed
    finally:
        blocker.rollback()
        blocker.close()
        kill_group(cluster, signal.SIGTERM)
        drop_tables("rr_alpha", "rr_beta")


def test_a_dead_one_shot_schedule_is_rearmed_by_the_clusters_reconciler(make_user):
    from django.utils import timezone
    from django_q.models import Schedule

    from retention.schedule_math import next_tick
    from runs.engine.schedules import schedule_name

    policy = policy_on(make_user, "alpha", "rr_alpha", catch_up="none")
    # a trigger that failed before arm(): django-q2 already set repeats=0
    Schedule.objects.filter(name=schedule_name(policy)).update(
        repeats=0, next_run=timezone.now() - timedelta(hours=5)
    )
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        enqueue_reconcile()
        schedule = wait_for(
            lambda: Schedule.objects.filter(name=schedule_name(policy), repeats=1).first(),
            timeout=30,
            interval=0.5,
            what="the schedule to be re-armed",
        )
        assert schedule.next_run == next_tick(policy, timezone.now())
        assert schedule.next_run > timezone.now()
    finally:
        kill_group(cluster, signal.SIGTERM)
        drop_tables("rr_alpha")


def test_a_late_firing_after_an_outage_follows_the_catch_up_rule(make_user):
    """The cluster was down since yesterday's 03:00: the schedules are still armed for it."""
    from django.utils import timezone
    from django_q.models import Schedule

    from retention.schedule_math import latest_tick
    from runs.engine.schedules import schedule_name

    latest = policy_on(make_user, "alpha", "rr_alpha", approved_ago=timedelta(days=3))
    none = policy_on(make_user, "beta", "rr_beta", approved_ago=timedelta(days=3), catch_up="none")
    newest = latest_tick(latest, timezone.now() - timedelta(minutes=2))
    missed = newest - timedelta(days=1)
    Schedule.objects.filter(name__in=[schedule_name(latest), schedule_name(none)]).update(
        next_run=missed, repeats=1
    )
    cluster = spawn("qcluster", env=CLUSTER_ENV)
    try:
        wait_for(
            lambda: (
                Schedule.objects.filter(
                    name__in=[schedule_name(latest), schedule_name(none)],
                    next_run__gt=timezone.now(),
                ).count()
                == 2
            ),
            timeout=90,
            interval=1,
            what="both late firings to run and re-arm",
        )
        enqueue_reconcile()
        wait_for(
            lambda: any(success for success, _ in reconcile_passes()),
            timeout=30,
            what="a reconciler pass",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
        drop_tables("rr_alpha", "rr_beta")
    runs = list(Run.objects.filter(policy=latest).values_list("tick", "source", "skipped_ticks"))
    assert [(tick, source) for tick, source, _ in runs] == [(newest, "catch-up")], runs
    assert missed.isoformat() in runs[0][2]
    assert not Run.objects.filter(policy=none).exists()


def _group_alive(pgid: int) -> list[int]:
    """The processes of the process group that are still running (zombies are gone)."""
    import os

    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            alive.append(int(entry))
    return alive


@pytest.mark.parametrize(
    "sig, attempt",
    [(signal.SIGTERM, n) for n in (1, 2, 3)] + [(signal.SIGINT, n) for n in (1, 2, 3)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_a_cluster_stops_within_ten_seconds_while_a_reconciler_pass_waits_on_locks(
    make_user, sig, attempt
):
    """Two policies' tables are held ACCESS EXCLUSIVE by another session; each has a run to
    verify and a missed tick to catch up (a new run samples its table). Two seconds into the
    pass, SIGTERM reaches the main process (as systemd sends it) or SIGINT the whole group (as
    Ctrl-C does): every process of the cluster is gone within 10 s."""
    import os

    from django_q.models import OrmQ

    from runs.engine import planner
    from runs.models import Chunk

    for slug in ("alpha", "beta"):
        policy = policy_on(
            make_user, slug, f"rr_{slug}", approved_ago=timedelta(days=3), chunking="auto"
        )
        run, _ = trigger_run_at(policy, days_ago=4)
        while not run.planner_done:
            planner.plan(run, window=1000)
        Chunk.objects.filter(run=run).update(state=Chunk.State.DONE)
    OrmQ.objects.all().delete()  # only the reconciler's pass runs on the cluster
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_alpha, public.rr_beta IN ACCESS EXCLUSIVE MODE")
    observer = pg_connect()
    # a task timeout of two minutes: a pass may take a minute, its statements ten seconds
    env = {"Q_CLUSTER_NAME": "cleanup", "RETENTION_Q_TIMEOUT": "120", "RETENTION_Q_RETRY": "150"}
    cluster = spawn("qcluster", env=env)
    try:
        enqueue_reconcile()
        wait_for(
            lambda: observer.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE NOT l.granted AND a.application_name = 'retention:cleanup'"
                " AND l.relation IN ('public.rr_alpha'::regclass, 'public.rr_beta'::regclass)"
            ).fetchone()[0],
            timeout=60,
            interval=0.1,
            what="the reconciler's pass waiting on a locked table",
        )
        time.sleep(2)  # two seconds into the blocked pass
        if sig == signal.SIGTERM:
            cluster.send_signal(sig)  # the main process only, as a supervisor must
        else:
            os.killpg(cluster.pid, sig)  # a terminal's Ctrl-C reaches the whole group
        stopped_at = time.monotonic()
        while _group_alive(cluster.pid) and time.monotonic() - stopped_at < 10:
            time.sleep(0.05)
        left = _group_alive(cluster.pid)
        print(f"{sig.name} #{attempt}: {time.monotonic() - stopped_at:.1f} s to stop")
        assert not left, f"{len(left)} process(es) still running 10 s after {sig.name}"
        assert cluster.wait(timeout=5) is not None
    finally:
        kill_group(cluster, signal.SIGKILL)
        blocker.rollback()
        blocker.close()
        observer.close()
        drop_tables("rr_alpha", "rr_beta")


def trigger_run_at(policy, *, days_ago: int):
    from django.utils import timezone

    from runs.actions import trigger_run

    return trigger_run(policy, tick=timezone.now() - timedelta(days=days_ago))
