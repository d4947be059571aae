"""Each target is its own failure domain for the admission guard and the ceilings: two worker
processes over two targets hold each target's own ceilings, and a guard throttle on one target
(a lock another session holds on its table, which its guard reads) holds only that target's
chunks while the other target's keep being admitted."""

from __future__ import annotations

import signal

import psycopg
import pytest

from runs.engine import guard
from runs.models import AuditRecord, Chunk, GuardSample, Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import kill_group, spawn, wait_for
from tests.runs.test_ceilings_and_lanes import max_overlap

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_REASON = "lock held on public.rr_events"


@pytest.fixture
def pair(fleet):
    """Two targets on two servers (group ``pair``): ``a`` is the one whose guard throttles."""
    a, b = fleet[0], fleet[1]
    Target.objects.filter(name__in=[a.name, b.name]).update(group="pair")
    return a, b


def _trigger(make_user, act_as, **spec) -> list[str]:
    approved_policy(make_user, **events_spec(targets=["group:pair"], **spec))
    act_as(make_user("olga", "oncall"))
    return run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()


def _lock_table(target) -> psycopg.Connection:
    """Another session of ``target``'s server holding ``SHARE`` on the table (what a plain
    ``CREATE INDEX`` takes) until it is closed: the guard reads it as a lock held on the
    table and throttles that target's chunks."""
    conn = psycopg.connect(target.url, autocommit=False)
    conn.execute("SET application_name = 'test-ddl'")
    conn.execute("LOCK TABLE public.rr_events IN SHARE MODE")
    return conn


def test_a_throttle_on_one_target_is_not_the_others_verdict(pair, make_user, act_as):
    """In one process, the guard's verdict for one target is never reused for another, even
    when both targets' latest samples have the same id (each ledger numbers its own)."""
    a, b = pair
    for target in pair:
        with C.on(target.name):
            create_events(600, days=40)
    _trigger(make_user, act_as, chunking="key", chunk_size=100)
    locker = _lock_table(a)
    try:
        verdicts, samples = {}, {}
        for target in (a, b, a, b):
            with C.on(target.name):
                run = Run.objects.select_related("policy_version").get()
                verdicts.setdefault(target.name, []).append(
                    guard.admission(run, run.policy_version.parsed)
                )
                samples[target.name] = list(GuardSample.objects.values_list("pk", flat=True))
    finally:
        locker.close()
    # each ledger numbers its own samples: both first verdicts were judged on a sample with id 1
    # (a busy machine may take a second one on either ledger before the last call)
    assert min(samples[a.name]) == min(samples[b.name]) == 1, samples
    for verdict in verdicts[a.name]:
        assert not verdict.admit and LOCK_REASON in verdict.reason, verdict
    for verdict in verdicts[b.name]:
        assert LOCK_REASON not in verdict.reason, verdict


ROWS = 4000  # per target; about 60% eligible, five tenants
SCHEMA = "retention_runner"


def _eligible(target, cutoff) -> int:
    return target.scalar(
        "SELECT count(*) FROM public.rr_events WHERE occurred_at < %s AND status <> 'disputed'",
        [cutoff],
    )


def _run_state(target) -> str:
    return target.scalar(f"SELECT state FROM {SCHEMA}.runs_run")


def _throttle_reasons(target) -> set[str]:
    with target.connect() as conn:
        rows = conn.execute(
            f"SELECT DISTINCT throttle_reason FROM {SCHEMA}.runs_chunk WHERE throttle_reason <> ''"
        ).fetchall()
    return {r[0] for r in rows}


def test_two_worker_processes_hold_each_targets_ceilings_and_a_throttle_holds_only_its_target(
    pair, make_user, act_as
):
    a, b = pair
    for target in pair:
        with C.on(target.name):
            create_events(ROWS, days=40)
    # per-tenant chunks, two of the policy's at once and one per tenant on each target; paced
    # (2400 rows/s), so that the four workers meet on a's chunks once its lock is gone
    keys = _trigger(
        make_user,
        act_as,
        chunk_size=60,
        pace_rows_per_s=2400,
        limits={"policy_workers": 2, "tenant_workers": 1},
    )
    assert [k.split(":")[0] for k in keys] == [a.name, b.name]
    cutoffs = {}
    for target in pair:
        with C.on(target.name):
            cutoffs[target.name] = Run.objects.get().cutoff
    expected = {t.name: _eligible(t, cutoffs[t.name]) for t in pair}

    # a session takes SHARE on a's table (a plain CREATE INDEX would): a's guard reads the lock
    # and throttles a's chunks; b's guard reads nothing of it
    locker = _lock_table(a)
    held_from = locker.execute("SELECT clock_timestamp()").fetchone()[0]
    # two worker processes of two workers each: a worker drains the targets in turn, the
    # second of each process starting at the second target; each process names its sessions
    # on a (``retention:…``, the product's own to the guard), so that the test sees both wait
    # there
    sep = "&" if "?" in a.url else "?"
    workers = [
        spawn(
            "retention",
            "drain",
            "--until-idle",
            "--workers",
            "2",
            env={a.env: f"{a.url}{sep}application_name=retention:drain-{i}"},
        )
        for i in (1, 2)
    ]
    seen: dict[str, set[str]] = {a.name: set(), b.name: set()}
    records_of = f"SELECT count(*) FROM {SCHEMA}.runs_auditrecord"
    try:

        def held_while_b_drains() -> bool:
            for target in pair:
                seen[target.name] |= _throttle_reasons(target)
            waiting = a.scalar(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE %s",
                ["retention:drain-%"],
            )
            return (
                _run_state(b) == "drained"
                and any(LOCK_REASON in r for r in seen[a.name])
                and waiting == 2
            )

        wait_for(
            held_while_b_drains,
            timeout=240,
            interval=0.2,
            what=lambda: f"b drained ({_run_state(b)}) while a is throttled ({seen})",
        )
        assert a.scalar(records_of) == 0  # nothing committed on a meanwhile
        held_until = locker.execute("SELECT clock_timestamp()").fetchone()[0]
        locker.close()
        locker = None
        for worker in workers:
            worker.wait(timeout=240)
    finally:
        if locker is not None:
            locker.close()
        for worker in workers:
            kill_group(worker, signal.SIGKILL)
    for worker in workers:
        assert worker.returncode == 0, worker.stderr.read()[-2000:]

    records = {}
    for target in pair:
        with C.on(target.name):
            assert Run.objects.get().state == Run.State.DRAINED
            records[target.name] = list(
                AuditRecord.objects.values_list(
                    "tenant", "started_at", "committed_at", "worker_pid", "rows_deleted"
                )
            )
            assert not Chunk.objects.exclude(state=Chunk.State.DONE).exists()
            samples = list(GuardSample.objects.values_list("taken_at", "tables"))
        held = [
            taken
            for taken, tables in samples
            if (tables.get("public.rr_events") or {}).get("conflicting_locks")
        ]
        if target is a:  # a's guard saw the lock, and saw it gone before its chunks went
            assert held and all(taken >= held_from for taken in held)
            assert any(taken > held_until for taken, _ in samples if taken not in held)
        else:  # b's never saw it
            assert held == []
        # every eligible row went, once, and each target's chain verifies
        assert sum(r[-1] for r in records[target.name]) == expected[target.name] > 0
        assert _eligible(target, cutoffs[target.name]) == 0
        with C.on(target.name):
            from runs.evidence.audit import verify_chain

            assert not verify_chain().problems

    for name, rows in records.items():
        # each target's own ceilings: two of the policy's chunks at once, one per tenant
        assert max_overlap([(s, e) for _, s, e, _, _ in rows]) <= 2, f"{name}: policy ceiling"
        by_tenant: dict[str, list] = {}
        for tenant, start, end, _, _ in rows:
            by_tenant.setdefault(tenant, []).append((start, end))
        for tenant, intervals in by_tenant.items():
            assert max_overlap(intervals) <= 1, f"{name}: tenant {tenant} exceeded its ceiling"
    # while a was held, b's chunks kept being admitted: b drained whole in that time, and
    # every chunk of a committed after it
    assert all(held_from <= start and end <= held_until for _, start, end, _, _ in records[b.name])
    assert all(start >= held_until for _, start, *_ in records[a.name])
    # b's chunks were never refused for a's lock (b's own guard only ever judged b)
    assert not any(LOCK_REASON in reason for reason in seen[b.name]), seen[b.name]
