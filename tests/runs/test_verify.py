"""A run's verification: remaining, deferred and NULL rows counted by one statement, in one scan
of the target's old rows, each figure exact up to the limit."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection

from retention import actions
from runs.actions import trigger_run
from runs.engine.reconciler import verify
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW

TABLE = '"public"."rr_verify"'


def _sql(text: str, params=None) -> None:
    with connection.cursor() as cur:
        cur.execute(text, params or [])


def _table() -> None:
    """Old rows (40 days, the policy keeps 20): 7 eligible (tenant 2), 5 under a hold on
    tenant 3 and one more there that is kept, 4 kept, 2 with a NULL key, 3 with a NULL
    tenant, 1 with a NULL timestamp; young rows, one of them with a NULL tenant."""
    _sql("DROP TABLE IF EXISTS public.rr_verify")
    _sql(
        "CREATE TABLE public.rr_verify (id bigint, tenant_id int, occurred_at timestamptz,"
        " status text)"
    )
    old, young = NOW.replace(month=10, day=21), NOW.replace(day=25)
    rows = (
        [(i, 2, old, "closed") for i in range(1, 8)]
        + [(i, 3, old, "closed") for i in range(101, 106)]
        + [(106, 3, old, "disputed")]
        + [(i, 2, old, "disputed") for i in range(201, 205)]
        + [(None, 2, old, "closed"), (None, 4, old, "closed")]
        + [(i, None, old, "closed") for i in range(401, 404)]
        + [(501, 2, None, "closed")]
        + [(i, 2, young, "closed") for i in range(601, 611)]
        + [(611, None, young, "closed")]
    )
    with connection.cursor() as cur:
        cur.executemany("INSERT INTO public.rr_verify VALUES (%s, %s, %s, %s)", rows)
    _sql("CREATE UNIQUE INDEX ON public.rr_verify (id)")
    _sql("CREATE INDEX ON public.rr_verify (tenant_id, id)")
    _sql("CREATE INDEX ON public.rr_verify (occurred_at)")
    _sql("ANALYZE public.rr_verify")


@contextmanager
def statements_on_target(seen: list):
    def record(execute, sql, params, many, context):
        if TABLE in sql:
            seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield


def test_verification_counts_remaining_held_and_null_rows_in_one_statement(db, make_user):
    _table()
    policy = approved_policy(make_user, **events_spec(slug="verify", table="rr_verify"))
    hold = actions.place_hold(
        actor=make_user("carol-verify", "compliance"), reason="litigation", policy=policy,
        tenant="3",
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)

    for limit, expected in ((100_000, (7, 5, 6)), (6, (6, 5, 6)), (2, (2, 2, 2))):
        seen: list = []
        with statements_on_target(seen):
            result = verify(run, limit=limit)
        figures = (result["remaining"], result["deferred_by_holds"], result["not_eligible_null"])
        # each figure is what its own count stopping at the limit says
        assert figures == expected, (limit, figures)
        assert result["limit"] == limit
        assert result["holds"] == [hold.pk]  # the holds the figures were counted under
        assert len(seen) == 1, seen


def _setting(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting(%s)", [name])
        return cur.fetchone()[0]


def test_verification_reads_the_old_range_by_a_bitmap_scan_of_the_timestamp_index(db, make_user):
    _table()
    policy = approved_policy(make_user, **events_spec(slug="verify", table="rr_verify"))
    run, _ = trigger_run(policy, tick=NOW)
    plans: list = []

    def explain(execute, sql, params, many, context):
        if TABLE in sql and sql.startswith("WITH"):
            raw = context["cursor"].cursor
            raw.execute("EXPLAIN (COSTS OFF) " + sql, params)
            plans.append("\n".join(row[0] for row in raw.fetchall()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain):
        result = verify(run)

    assert result["remaining"] == 12  # no hold here: tenant 3's five rows are eligible too
    assert result["holds"] == []
    (plan,) = plans
    target = [line for line in plan.splitlines() if "rr_verify" in line]
    assert any("Bitmap Index Scan on rr_verify_occurred_at_idx" in line for line in target), plan
    assert all("Bitmap" in line for line in target if "Scan" in line), plan
    # the planner's settings are the session's again afterwards
    assert [_setting(name) for name in ("enable_indexscan", "enable_seqscan")] == ["on", "on"]


def test_rows_a_before_delete_trigger_keeps_are_never_called_drained(make_user, no_guard):
    """A row-level BEFORE DELETE trigger that returns NULL for some rows (an application's
    "pinned" rows): the chunks that met them are done, yet the rows are there. Verification
    reads the whole old range instead of trusting the chunks, finds them, and the run ends in
    attention naming the trigger — never "verified: no eligible row left"."""
    from django.db import connection

    from runs.actions import trigger_run
    from runs.engine import worker
    from runs.evidence import audit
    from runs.models import AuditRecord, Run
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, count, create_events

    create_events(3000)
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION public.rr_keep_pinned() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN IF OLD.id BETWEEN 500 AND 520 THEN RETURN NULL; END IF; RETURN OLD; END$$"
        )
        cur.execute(
            "CREATE TRIGGER rr_keep_pinned BEFORE DELETE ON public.rr_events"
            " FOR EACH ROW EXECUTE FUNCTION public.rr_keep_pinned()"
        )
    try:
        policy = approved_policy(
            make_user, **events_spec(chunk_size=300, max_passes=2, chunking="key")
        )
        run, _ = trigger_run(policy, tick=NOW)
        for _ in range(4):  # a drain ends with its pass's verification
            worker.drain(run.pk, budget_s=120)
            run.refresh_from_db()
            if run.state != Run.State.ACTIVE:
                break
        kept = count(
            "public.rr_events", "id BETWEEN 500 AND 520 AND occurred_at < %s AND status <> 'disputed'",
            [run.bound],
        )  # fmt: skip
        assert kept > 10  # in a chunk in the middle of the pass
        assert run.state == Run.State.ATTENTION, run.state_reason
        assert "no eligible row left" not in run.state_reason
        assert run.state_reason.startswith(f"{run.verification['remaining']:,} eligible row(s)")
        assert "trigger(s) rr_keep_pinned on public.rr_events" in run.state_reason
        assert run.verification["remaining"] >= kept
        # counted as kept where it happened: the chunks' audit records (chain version 9) say
        # how many rows their DELETEs matched and the trigger kept, each pass summed apart
        records = AuditRecord.objects.filter(run=run)
        assert all(
            r.chain_version == audit.TRIGGER_KEPT_CHAIN_VERSION and r.rows_kept_by_triggers >= 0
            for r in records
        )
        assert run.verification["kept_by_triggers"] == kept
        assert audit.rows_kept_by_triggers(run.pk, run.pass_no) == kept
        assert audit.rows_kept_by_triggers(run.pk) >= kept
        assert f"({kept:,} row(s) kept by BEFORE DELETE trigger(s) rr_keep_pinned" in (
            run.state_reason
        )
        assert audit.verify_chain().ok
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")
            cur.execute("DROP FUNCTION IF EXISTS public.rr_keep_pinned()")


def test_a_run_made_just_after_a_release_never_calls_the_rows_its_workers_still_held_drained(
    db, make_user, no_guard
):
    """A worker process reads the verified releases again every ``RELEASES_TTL_S`` seconds: one
    whose list is older than a release keeps the hold in force a little longer, and its chunks
    skip the hold's rows. A run made in that window must not take its done chunks for proof
    that their ranges are empty: its verification reads the rows and names what it finds."""
    import time

    from retention import decisions
    from runs.engine import worker
    from runs.evidence.invariants import check_run
    from runs.models import Run
    from tests.runs.conftest import create_events

    create_events(3000)
    policy = approved_policy(make_user, **events_spec(chunking="key"))
    hold = actions.place_hold(
        actor=make_user("keeper", "compliance"), reason="litigation", policy=policy, tenant="3"
    )
    actions.request_hold_release(hold, actor=make_user("asker", "compliance"), reason="settled")
    actions.approve_hold_release(hold, actor=make_user("judge", "compliance"), reason="settled")
    # this process's list was read before the release, in another process's stead
    decisions._releases = (time.monotonic(), [])
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    decisions.forget()
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []
