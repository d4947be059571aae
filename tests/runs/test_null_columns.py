"""Rows whose tenant, key or timestamp is NULL: never eligible, for the planner and for
verification alike (one predicate), reported as "not eligible: NULL" — and the run drains."""

from __future__ import annotations

from django.db import connection

from retention.preview import preview
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import check_run
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count, create_events


def _add_null_rows() -> None:
    """Old rows with a NULL tenant, a NULL key and a NULL timestamp (in table and shadow)."""
    with connection.cursor() as cur:
        for table in ("rr_events", "rr_events_shadow"):
            cur.execute(f"ALTER TABLE public.{table} ALTER COLUMN tenant_id DROP NOT NULL")
            cur.execute(f"ALTER TABLE public.{table} ALTER COLUMN occurred_at DROP NOT NULL")
            if table == "rr_events":
                cur.execute("ALTER TABLE public.rr_events DROP CONSTRAINT rr_events_pkey")
                cur.execute("CREATE UNIQUE INDEX ON public.rr_events (id)")
            cur.execute(f"ALTER TABLE public.{table} ALTER COLUMN id DROP NOT NULL")
            cur.execute(
                f"""INSERT INTO public.{table} (id, tenant_id, occurred_at, status) VALUES
                    (100001, NULL, %s::timestamptz - interval '35 days', 'closed'),
                    (100002, NULL, %s::timestamptz - interval '36 days', 'closed'),
                    (NULL, 1, %s::timestamptz - interval '37 days', 'closed'),
                    (100003, 2, NULL, 'closed')""",
                [NOW, NOW, NOW],
            )


def test_rows_with_a_null_tenant_key_or_timestamp_are_not_eligible_and_the_run_drains(
    db, make_user
):
    create_events(1200)
    _add_null_rows()
    policy = approved_policy(make_user, **events_spec())
    spec = policy.approved_version.parsed
    warnings = policy.approved_version.validation["warnings"]
    for what in ("key", "timestamp", "tenant"):
        assert any(w.startswith(f"{what} column") and "is nullable" in w for w in warnings)

    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()

    assert run.state == Run.State.DRAINED, run.state_reason
    assert run.pass_no == 1
    assert run.verification["remaining"] == 0
    assert run.verification["not_eligible_null"] == 4
    assert "4 row(s) not eligible: NULL" in run.state_reason
    # the NULL rows are all still there; everything else eligible is gone
    assert count("rr_events", "tenant_id IS NULL") == 2
    assert count("rr_events", "id IS NULL") == 1
    assert count("rr_events", "occurred_at IS NULL") == 1
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []

    # the preview counts what a run deletes, and reports the same NULL rows
    shown = preview(spec, policy_id=policy.pk, now=NOW)
    assert shown["eligible"] == 0
    assert shown["not_eligible_null"] == {"tenant": 2, "key": 1, "timestamp": 1}
