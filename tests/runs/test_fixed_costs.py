"""The run's fixed costs that do not grow with the table: the last eligible key estimated from
the newest eligible rows (the verification finds what the estimate left out, and another pass
deletes it), a verification that reads only what the pass may have missed, and
``retention drain --workers N`` as N workers in one process."""

from __future__ import annotations

import io
import os

import pytest
from django.core.management import call_command
from django.db import connection

from core import locks
from runs.actions import trigger_run
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events


@pytest.mark.django_db(transaction=True)
def test_drain_with_two_workers_runs_them_in_one_process(make_user, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(6000)
    policy = approved_policy(
        make_user, **events_spec(tenant=None, chunking="key", chunk_size=50, pace_rows_per_s=1500)
    )
    run, _ = trigger_run(policy, tick=NOW)
    out = io.StringIO()
    call_command("retention", "drain", run.run_key, "--until-idle", "--workers", "2", stdout=out)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    lines = out.getvalue().splitlines()
    per_worker = [line for line in lines if line.startswith("worker ")]
    assert len(per_worker) == 2, lines
    # both workers took chunks, none failed
    assert all(" 0 chunk(s)" not in line for line in per_worker), lines
    assert lines[-1].endswith("; 0 failure(s)"), lines
    assert set(AuditRecord.objects.filter(run=run).values_list("worker_pid", flat=True)) == {
        os.getpid()
    }
    assert _eligible_left(run) == 0
    connection.close()


def _sql(text: str, params=None) -> None:
    with connection.cursor() as cur:
        cur.execute(text, params or [])


def _eligible_left(run) -> int:
    return count("public.rr_events", "occurred_at < %s AND status = 'closed'", [run.cutoff])


def _key_policy(make_user, **overrides):
    return approved_policy(
        make_user, **events_spec(tenant=None, chunking="key", chunk_size=100, **overrides)
    )


@pytest.fixture
def stragglers(db, settings):
    """``rr_events`` (ids in time order) with three old rows at keys 4001-4003, above every
    other old key and below ten young ones (5001-5010): the last eligible key is 4003. With an
    estimate from 5 rows, neither the top of the key's index (young) nor the 5 newest eligible
    rows (near the cutoff, keys around 1500) reach them."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False, "BOUND_ESTIMATE_ROWS": 5}
    create_events(3000)
    _sql(
        "INSERT INTO public.rr_events SELECT g, 2, %s::timestamptz - interval '35 days',"
        " 'closed', 'x' FROM generate_series(4001, 4003) AS g",
        [NOW],
    )
    _sql(
        "INSERT INTO public.rr_events SELECT g, 2, %s::timestamptz - interval '1 day',"
        " 'closed', 'x' FROM generate_series(5001, 5010) AS g",
        [NOW],
    )
    _sql("ANALYZE public.rr_events")


@pytest.mark.django_db(transaction=True)
def test_rows_beyond_an_estimated_last_key_are_found_and_deleted_by_another_pass(
    stragglers, make_user
):
    from runs.engine import worker
    from runs.models import PlannerCursor

    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    for _ in range(3):  # a drain ends with its pass; the next pass is drained again
        worker.drain(run.pk, budget_s=120, until_idle=True)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    first_pass = PlannerCursor.objects.get(run=run, pass_no=1)
    # the estimate fell short of the stragglers (what this test is about)
    assert int(first_pass.bound_at[0]) < 4001
    assert run.state == Run.State.DRAINED, run.state_reason
    assert run.pass_no == 2  # the first pass's verification found them
    second = PlannerCursor.objects.get(run=run, pass_no=2)
    # the second pass planned from the first pass's last chunk on, to the last straggler
    assert int(second.bound_at[0]) == 4003
    assert _eligible_left(run) == 0
    assert count("public.rr_events", "id BETWEEN 4001 AND 4003") == 0
    assert count("public.rr_events", "id > 5000") == 10  # the young rows stay
    assert run.verification["remaining"] == 0
    assert run.verification["read"].startswith("outside the pass's chunks")
    # the run page says what the verification read; where a next pass would plan stays inside
    from tests.runs.test_after_run import verification_section

    section = verification_section(run, make_user)
    assert "<dt>Read</dt>" in section and "outside the pass&#x27;s chunks" in section, section
    assert "missed" not in section
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_the_exact_bound_plans_the_stragglers_in_one_pass(stragglers, make_user, settings):
    from runs.engine import worker
    from runs.models import PlannerCursor

    settings.RETENTION = {**settings.RETENTION, "BOUND_ESTIMATE_ROWS": 0}
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert (run.pass_no, PlannerCursor.objects.get(run=run).bound_at) == (1, ["4003"])
    assert _eligible_left(run) == 0
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_the_top_of_the_key_index_gives_the_exact_last_key_when_it_is_old(make_user, settings):
    """Ages not in key order: an old row among the key's last keys is the last eligible key."""
    from runs.engine import planner

    settings.RETENTION = {**settings.RETENTION, "BOUND_ESTIMATE_ROWS": 5}
    create_events(3000)
    _sql(
        "INSERT INTO public.rr_events SELECT g, 2, %s::timestamptz - interval '35 days',"
        " 'closed', 'x' FROM generate_series(9001, 9002) AS g",
        [NOW],
    )
    _sql(
        "INSERT INTO public.rr_events SELECT g, 2, %s::timestamptz - interval '1 day',"
        " 'closed', 'x' FROM generate_series(9003, 9005) AS g",
        [NOW],
    )
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    spec = run.policy_version.parsed
    assert planner.estimate_rows(spec) == 5
    with connection.cursor() as cur:
        frag = planner.run_bounds_query(run, spec)
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        assert cur.fetchone() == (["1"], ["9002"])
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_verification_reads_below_the_first_chunk_and_from_the_last_one(make_user, settings):
    from runs.engine import worker
    from runs.engine.reconciler import verify

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED and run.pass_no == 1
    # written after the run: one old row below its first chunk, one above its last
    _sql(
        "INSERT INTO public.rr_events VALUES (0, 2, %s::timestamptz - interval '30 days',"
        " 'closed', 'x'), (7000, 2, %s::timestamptz - interval '30 days', 'closed', 'x')",
        [NOW, NOW],
    )
    found = verify(run)
    assert found["remaining"] == 2
    assert (found["missed"]["rows_below"], found["missed"]["rows_from"]) == (1, 1)
    assert found["missed"]["below"] == ["1"]
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_verification_reads_the_whole_old_range_where_the_chunks_cannot_tell(make_user, settings):
    """Per-tenant chunks, and a legal hold on the policy since the run began: the whole range."""
    from retention import actions
    from runs.engine import worker
    from runs.engine.reconciler import verify

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    per_tenant = approved_policy(make_user, **events_spec(slug="per-tenant"))
    run, _ = trigger_run(per_tenant, tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert run.verification["read"] == (
        f"the whole range older than the cutoff {run.bound:%Y-%m-%d %H:%M:%S} UTC"
    )

    create_events(3000)
    policy = _key_policy(make_user)
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.verification["read"].startswith("outside the pass's chunks")
    actions.place_hold(
        actor=make_user("carol-fixed", "compliance"), reason="litigation", policy=policy,
        key_from=100, key_to=200,
    )  # fmt: skip
    found = verify(run)
    assert found["read"].startswith("the whole range older than the cutoff ")
    connection.close()


class _OtherPlanner:
    """Another worker's planner inside its step: a thread with its own connection that plans a
    window of ``chunks`` chunks (``planner.step``) and keeps that transaction open until the
    drain under test has found nothing left to claim (``_recording`` sets ``go``), however
    long its claims took on a busy machine, or ``hold_s`` seconds at most; ``open`` is set
    while it is."""

    def __init__(self, run, chunks: int, hold_s: float = 30.0):
        import threading

        self.run, self.chunks, self.hold_s = run, chunks, hold_s
        self.open, self.go = threading.Event(), threading.Event()
        self.planned: int | None = None
        self.thread = threading.Thread(target=self._plan, daemon=True)

    def _plan(self) -> None:
        from django.db import transaction

        from runs.engine import planner

        spec = self.run.policy_version.parsed
        try:
            with transaction.atomic():
                self.planned = planner.step(self.run, spec, spec.chunk_size, self.chunks)
                self.open.set()
                self.go.wait(self.hold_s)
                self.open.clear()
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        assert self.open.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.go.set()
        self.thread.join(30)


def _recording(monkeypatch, other: _OtherPlanner) -> list:
    """Every claim and planner call of the drain under test, each with whether the other
    planner's transaction was open when it returned: ``("claim", kind, open)``, ``("plan",
    created, busy, open)``. The first claim that finds nothing lets the other planner's step
    end."""
    from runs.engine import planner, worker

    events: list = []
    real_process_one, real_plan = worker.process_one, planner.plan

    def process_one(run, **kw):
        outcome = real_process_one(run, **kw)
        events.append(("claim", outcome.kind, other.open.is_set()))
        if outcome.kind == worker.NO_WORK:
            other.go.set()  # nothing left to claim: the other planner's step may end
        return outcome

    def plan(run, **kw):
        planned = real_plan(run, **kw)
        events.append(("plan", int(planned), planned.busy, other.open.is_set()))
        return planned

    monkeypatch.setattr(worker, "process_one", process_one)
    monkeypatch.setattr(planner, "plan", plan)
    return events


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_nothing_to_claim_waits_for_the_other_workers_window_and_claims_from_it(
    make_user, settings, monkeypatch
):
    """Another worker's planner is inside its step and nothing is pending: this worker asks
    once, waits for that step's transaction (a lock wait, not a poll), then claims from the
    window it committed — every chunk of the run — without planning a chunk of its own."""
    from runs.engine import planner, worker
    from runs.models import Chunk

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    planner.ensure_cursors(run, run.policy_version.parsed)
    with _OtherPlanner(run, chunks=1000) as other:  # one window: the whole run
        events = _recording(monkeypatch, other)
        stats = worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    window = Chunk.objects.filter(run=run).count()
    assert other.planned == window > 1
    # asked once while the other planner's transaction was open, then waited for it
    assert [e for e in events if e[-1]] == [
        ("plan", 0, True, True),
        ("claim", worker.NO_WORK, True),
    ], events
    assert stats["planner_waits"] == 1
    # and drained the other planner's window, planning nothing itself
    assert stats["chunks"] == window and stats["planned"] == 0
    assert _eligible_left(run) == 0
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_worker_drains_what_is_pending_while_another_worker_plans_the_next_window(
    make_user, settings, monkeypatch
):
    """The window is half drained and another worker's planner is planning the next one: this
    worker asks the planner once, then claims the pending chunks without asking again on each
    of them (each ask a planner transaction that finds the cursor locked), and waits for the
    other's window when nothing is left to claim."""
    from runs.engine import planner, worker

    settings.RETENTION = {**settings.RETENTION, "GUARD": False, "PLANNER_WINDOW": 8}
    create_events(6000)
    policy = approved_policy(make_user, **events_spec(tenant=None, chunking="key", chunk_size=50))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run, window=4)  # pending 4 <= 8 // 2: a worker's next call plans
    with _OtherPlanner(run, chunks=4) as other:
        events = _recording(monkeypatch, other)
        stats = worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    while_open = [e for e in events if e[-1]]
    # one planner call found the cursor locked; the four pending chunks were claimed after it
    assert [e for e in while_open if e[0] == "plan"] == [("plan", 0, True, True)], while_open
    assert [e[1] for e in while_open if e[0] == "claim"] == [worker.DONE] * 4 + [worker.NO_WORK]
    assert stats["planner_waits"] == 1
    assert _eligible_left(run) == 0
    connection.close()


def _index_entries_read(table: str) -> int:
    """Index entries this transaction has read from ``table``'s indexes so far."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)"
            " FROM pg_index WHERE indrelid = %s::regclass",
            [f"public.{table}"],
        )
        return int(cur.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_read_above_the_last_key_is_taken_beside_the_chunks_and_the_finish_reads_past_it(
    make_user, settings
):
    """The drain takes the read above the walk's last key once the planner has reached that
    key; the finish then reads the last chunk's keys and those from the highest key that read
    saw on — not the young keys above the last chunk, nor the old range — and still finds an
    old row written at the top after the run."""
    from django.db import transaction

    from runs.engine import worker
    from runs.engine.reconciler import verify
    from runs.models import PlannerCursor

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)  # ids in time order: 1-1500 older than the cutoff, 1501-3000 younger
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    record = PlannerCursor.objects.get(run=run).read_above
    assert record is not None and record["top"] == ["3000"] and record["found"] == []
    assert run.verification["read_above"] == record
    assert "from 3000 on" in run.verification["read"], run.verification["read"]
    _sql(
        "INSERT INTO public.rr_events VALUES (3001, 2, %s::timestamptz - interval '30 days',"
        " 'closed', 'late')",
        [NOW],
    )
    with transaction.atomic():
        before = _index_entries_read("rr_events")
        found = verify(run)
        narrow = _index_entries_read("rr_events") - before
    assert (found["remaining"], found["missed"]["rows_from"]) == (1, 1)
    # the last chunk's keys and those from 3000 on; without the early read, the 1,500 young
    # keys above the last chunk or the 1,500 old rows by the timestamp's index
    last = run.chunks.order_by("-key_from").first()
    # the first window's 8 chunks of the policy's 100 keys end at 801; the rest of the old
    # keys, up to 1500, are at most one more chunk
    assert last.key_from >= 801 and last.key_to <= 1501, last
    assert narrow <= 2 * (last.key_to - last.key_from) < 1500, narrow
    PlannerCursor.objects.filter(run=run).update(read_above=None)
    with transaction.atomic():
        before = _index_entries_read("rr_events")
        assert verify(run)["remaining"] == 1
        assert _index_entries_read("rr_events") - before >= 1500
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_finisher_waits_for_the_read_above_in_progress_rather_than_read_beside_it(
    make_user, settings
):
    """Another session is taking the read above the last key (it holds the pass's read-above
    lock): the finisher's look for it waits for that transaction and uses its record."""
    import threading

    from django.db import transaction

    from runs.engine import planner, reconciler, worker

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    planner.plan(run, window=100_000)  # the walk reaches its last key
    while worker.process_one(run).kind == worker.DONE:
        pass
    spec = run.policy_version.parsed
    assert reconciler.early_read(run, spec) is None  # not taken: the finish reads it all
    holding, taken = threading.Event(), {}

    def other() -> None:
        try:
            with transaction.atomic():
                locks.xact_lock(locks.READ_ABOVE, run.pk)
                holding.set()
                threading.Event().wait(0.5)  # a read in progress
                taken["record"] = reconciler.read_above(run)
        finally:
            connection.close()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    assert holding.wait(30)
    record = reconciler.early_read(run, spec)
    thread.join(30)
    assert taken["record"] is not None
    assert record == taken["record"]
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_the_planner_plans_while_the_read_above_the_last_key_is_in_progress(
    make_user, settings, monkeypatch
):
    """The read above the last key takes half a second on a large table: the planner's steps,
    which lock the pass's cursor, go on beside it (a step that found the cursor taken would
    leave every worker waiting for the read), and the read's record is kept after them."""
    import threading

    from django.db import transaction

    from runs.engine import planner, reconciler
    from runs.models import PlannerCursor

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    assert planner.plan(run, window=2) == 2  # the pass's bounds are known, the walk goes on
    reading, done, taken = threading.Event(), threading.Event(), {}
    fetch = reconciler._fetch

    def slow_fetch(frag):  # the read, in its transaction, lasting until the planner has planned
        found = fetch(frag)
        reading.set()
        done.wait(30)
        return found

    def other() -> None:
        try:
            taken["record"] = reconciler.read_above(run)
        finally:
            connection.close()

    monkeypatch.setattr(reconciler, "_fetch", slow_fetch)
    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    assert reading.wait(30)
    try:
        with transaction.atomic():
            made = planner.step(run, run.policy_version.parsed, 100, 3)
    finally:
        done.set()
        thread.join(30)
    assert made == 3
    assert taken["record"] is not None and taken["record"]["top"] == ["3000"]
    cursor = PlannerCursor.objects.get(run=run)
    assert cursor.read_above == taken["record"]
    assert cursor.chunks_planned == 5
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_per_tenant_run_estimates_its_last_key_instead_of_reading_the_young_rows(
    make_user, settings
):
    """Per-tenant chunks: the pass's bounds read a few index entries, not the young half of the
    key's index backwards (on a heap clustered by tenant each of those entries is a heap row in
    another tenant's part of the table), and the estimate is the exact last key here."""
    from django.db import transaction

    from runs.engine import planner
    from runs.models import PlannerCursor

    settings.RETENTION = {**settings.RETENTION, "GUARD": False, "BOUND_ESTIMATE_ROWS": 50}
    create_events(3000)  # ids in time order: 1-1500 older than the cutoff, 1501-3000 younger
    run, _ = trigger_run(approved_policy(make_user, **events_spec(slug="per-tenant")), tick=NOW)
    spec = run.policy_version.parsed
    assert run.per_tenant(spec)
    with connection.cursor() as cur:
        frag = planner.bounds_query(run.policy_id, run.bound, spec)  # exact
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        _first, last = cur.fetchone()
    with transaction.atomic():
        before = _index_entries_read("rr_events")
        planner.ensure_cursors(run, spec)
        read = _index_entries_read("rr_events") - before
    # the first key, the key index's last 50 entries, the 50 newest eligible rows (and the
    # kept ones among them) by the timestamp's index, and the tenants; read exactly, the
    # 1,500 young keys above the last old one
    assert read <= 200, read
    cursors = PlannerCursor.objects.filter(run=run)
    assert cursors.count() == 5
    assert {tuple(c.bound_at) for c in cursors} == {tuple(last)}
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_per_tenant_run_deletes_old_rows_above_its_estimate_in_another_pass(
    stragglers, make_user
):
    """The estimate falls short of three old rows above it: the per-tenant verification, over
    the whole old range, finds them and the next pass deletes them."""
    from runs.engine import worker
    from runs.models import PlannerCursor

    policy = approved_policy(make_user, **events_spec(slug="per-tenant", chunk_size=100))
    run, _ = trigger_run(policy, tick=NOW)
    for _ in range(3):
        worker.drain(run.pk, budget_s=120, until_idle=True)
        run.refresh_from_db()
        if run.state != Run.State.ACTIVE:
            break
    assert all(int(c.bound_at[0]) < 4001 for c in PlannerCursor.objects.filter(run=run, pass_no=1))
    assert run.state == Run.State.DRAINED, run.state_reason
    assert run.pass_no == 2
    assert run.verification["read"] == (
        f"the whole range older than the cutoff {run.bound:%Y-%m-%d %H:%M:%S} UTC"
    )
    assert _eligible_left(run) == 0
    assert count("public.rr_events", "id > 5000") == 10  # the young rows stay
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_looked_just_before_another_workers_window_committed_claims_again(
    make_user, settings, monkeypatch
):
    """Two workers start a run together: the first plans its first window while the second
    finds the planner busy and claims — nothing yet — and the window commits just after that
    claim looked. The second worker then sees chunks pending: it claims again and drains them,
    where before it reported the run idle ("no chunk is admissible now") and `--until-idle`
    waited half a second before looking again — most of a 1M-row run, drained by one worker."""
    from runs.engine import planner, worker
    from runs.models import Chunk

    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(3000)
    run, _ = trigger_run(_key_policy(make_user), tick=NOW)
    real_plan, real_claim = planner.plan, worker._claim
    events: list = []

    def plan(run, **kw):
        if not events:  # the other worker's planner holds the cursors: nothing planned here
            events.append("plan: busy")
            return planner.Planned.of(0, busy=True)
        return real_plan(run, **kw)

    def claim(run, spec, **kw):
        found = real_claim(run, spec, **kw)
        if events == ["plan: busy"]:
            events.append(f"claim: {found}")
            # the other worker's window commits right after this claim looked
            events.append(f"window: {int(real_plan(run, window=1000))}")
        return found

    monkeypatch.setattr(planner, "plan", plan)
    monkeypatch.setattr(worker, "_claim", claim)
    stats = worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    chunks = Chunk.objects.filter(run=run).count()
    assert events[:2] == ["plan: busy", "claim: None"] and events[2] == f"window: {chunks}"
    assert chunks > 1
    assert (stats["chunks"], stats.get("stopped")) == (chunks, "no work left"), stats
    assert run.state == Run.State.DRAINED, run.state_reason
    connection.close()
