"""No partition is left in a state without an exit: a partition the run cannot put back ends in
attention with the reason and two ways out (move the conflicting rows and replay, or keep it
detached on the record); a detach that timed out on a lock is tried again instead of leaving
the partition to row deletes for good; an expired partition that is empty is dropped; and
the reconciler finishes or surfaces a partition left detached or DETACH PENDING by a run that
ended. docs/engine.md, "Partitions"."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from core.models import OperatorAction
from retention import actions as retention_actions
from runs.actions import cancel_run, discard_dead_letter, replay_dead_letter, trigger_run
from runs.engine import worker
from runs.engine.reconciler import reconcile
from runs.evidence import exports
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, DeadLetter, PartitionAction, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count
from tests.runs.processes import pg_connect
from tests.runs.test_partitions import (
    MONTHS,
    _bounds,
    _interrupted_after_detach,
    attached,
    create_partitioned,
    drain,
    parts,
    parts_spec,
    relation_exists,
    shadow_month,
)

__all__ = ["parts"]

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def parts_with_default(transactional_db, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned(default=True)
    yield "rr_parts"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def _sql(text: str, params=None):
    with connection.cursor() as cur:
        cur.execute(text, params or [])


def _wedged(make_user) -> tuple[Run, object]:
    """A worker died between the detach of February and its drop; meanwhile a hold on tenant 4
    was placed and the application wrote a row dated in February, which went to the default
    partition. February's rows are invisible to the application; it cannot be put back."""
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    _interrupted_after_detach(run, "2026_02")
    keeper = make_user("kim", "compliance")
    retention_actions.place_hold(actor=keeper, reason="audit", policy=policy, tenant="4")
    for table in ("rr_parts", "rr_parts_shadow"):  # the shadow: the table before the run
        _sql(
            f"INSERT INTO public.{table} VALUES (900001, 2, '2026-02-14 10:00+00', 'closed', 'late')"
        )
    assert count("public.rr_parts_default") == 1
    stats = worker.drain(run.pk, budget_s=30, until_idle=True)
    run.refresh_from_db()
    return run, stats


def test_a_partition_that_cannot_be_put_back_puts_the_run_in_attention_with_a_way_out(
    parts_with_default, make_user
):
    run, stats = _wedged(make_user)
    assert run.state == Run.State.ATTENTION, (run.state, run.state_reason, stats)
    reason = run.state_reason
    assert "public.rr_parts_2026_02" in reason and "default partition" in reason, reason
    assert "replay" in reason and "discard" in reason, reason
    letter = DeadLetter.objects.get(run=run, resolution=DeadLetter.Resolution.OPEN)
    assert letter.context["stage"] == "partition"
    assert letter.context["partition"] == "public.rr_parts_2026_02"
    assert letter.sqlstate == "23514"
    assert not attached("rr_parts_2026_02")  # nothing was dropped, nothing lost
    assert count("public.rr_parts_2026_02") == shadow_month("2026_02") - 1  # not the late row

    # the way out: move the application's row out of the default partition, replay
    _sql("DELETE FROM public.rr_parts_default")
    oncall = make_user("olga", "oncall")
    replay_dead_letter(letter, actor=oncall, reason="moved the late row to the archive")
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    action = PartitionAction.objects.get(run=run, name="rr_parts_2026_02")
    assert action.state == "left" and attached("rr_parts_2026_02")  # held rows: chunks
    assert count("public.rr_parts_2026_02") == count("public.rr_parts_2026_02", "tenant_id = 4")


def test_keeping_a_partition_that_cannot_be_put_back_detached_is_on_the_record(
    parts_with_default, make_user
):
    run, _ = _wedged(make_user)
    assert run.state == Run.State.ATTENTION, run.state_reason
    letter = DeadLetter.objects.get(run=run, resolution=DeadLetter.Resolution.OPEN)
    oncall = make_user("olga", "oncall")
    discard_dead_letter(letter, actor=oncall, reason="legal keeps February apart for now")
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    action = PartitionAction.objects.get(run=run, name="rr_parts_2026_02")
    assert action.state == "kept"
    assert "olga" in action.note and "legal keeps February apart" in action.note
    assert relation_exists("rr_parts_2026_02") and not attached("rr_parts_2026_02")
    # nothing deleted (the late row went to the default partition)
    assert count("public.rr_parts_2026_02") == shadow_month("2026_02") - 1
    assert not AuditRecord.objects.filter(run=run, partition__name="public.rr_parts_2026_02")
    manifest = json.loads("".join(exports.manifest_json(run)))
    (kept,) = [p for p in manifest["partitions"] if p["partition"] == "public.rr_parts_2026_02"]
    assert kept["state"] == "kept" and "not audited" in kept["note"]
    # the checker counts the kept table's rows as still there, not as gone unaudited
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_a_detach_that_timed_out_on_a_lock_is_tried_again_not_left_to_row_deletes(parts, make_user):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    # a maintenance command on March holds a lock the detach needs (reads still pass)
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE public.rr_parts_2026_03 IN SHARE UPDATE EXCLUSIVE MODE")
    try:
        stats = worker.drain(run.pk, budget_s=30, until_idle=True)
    finally:
        blocker.rollback()
        blocker.close()
    march = PartitionAction.objects.get(run=run, name="rr_parts_2026_03")
    assert march.state == "detaching", (march.state, march.note, stats)
    assert "lock timeout" in march.note and march.attempts == 1
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    march.refresh_from_db()
    assert march.state == "dropped" and not relation_exists("rr_parts_2026_03")
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_an_expired_partition_that_is_empty_is_dropped(parts, make_user):
    _sql("DELETE FROM public.rr_parts_2026_04")  # emptied by an earlier run's chunks
    _sql(
        "DELETE FROM public.rr_parts_shadow WHERE occurred_at >= '2026-04-01 00:00+00'"
        " AND occurred_at < '2026-05-01 00:00+00'"
    )
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    april = PartitionAction.objects.get(run=run, name="rr_parts_2026_04")
    assert april.state == "dropped" and april.rows == 0
    assert not relation_exists("rr_parts_2026_04")
    assert april.chunk.audit.rows_deleted == 0 and april.chunk.audit.partition["rows"] == 0
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_the_reconciler_puts_back_what_a_cancelled_run_left_detached_or_detach_pending(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    _interrupted_after_detach(run, "2026_02")  # detached, the drop never came
    PartitionAction.objects.create(run=run, schema="public", name="rr_parts_2026_05",
                                   bounds=_bounds("2026_05"), action="drop", concurrently=True)  # fmt: skip
    _detach_pending("rr_parts_2026_05")
    cancel_run(run, actor=make_user("olga", "oncall"), reason="wrong policy")
    report = reconcile()
    for month in ("2026_02", "2026_05"):
        name = f"rr_parts_{month}"
        assert attached(name) and not _pending(name), report
        assert count(f"public.{name}") == shadow_month(month)
        action = PartitionAction.objects.get(run=run, name=name)
        assert action.state == "left" and "put back by the reconciler" in action.note
    assert sorted(report["partitions"]) == [
        "public.rr_parts_2026_02: put back (run cancelled)",
        "public.rr_parts_2026_05: put back (run cancelled)",
    ], report
    assert OperatorAction.objects.filter(action="partition.put_back").count() == 2
    assert reconcile()["partitions"] == []  # once


def test_the_reconciler_surfaces_a_detach_pending_partition_it_did_not_start(parts, make_user):
    approved_policy(make_user, **parts_spec(keep=[]))
    _detach_pending("rr_parts_2026_06")
    report = reconcile()
    assert report["partitions"] == [
        "public.rr_parts_2026_06: DETACH PENDING on public.rr_parts, not started by a run of"
        " this policy: finish it (ALTER TABLE … DETACH PARTITION … FINALIZE) or attach it"
        " again; no partition of the table can be detached until then"
    ], report
    assert _pending("rr_parts_2026_06")  # not this product's to finish


def _detach_pending(name: str) -> None:
    """A DETACH … CONCURRENTLY cut short in its second phase (it waited for a transaction
    that had read the parent)."""
    old_snapshot = pg_connect(autocommit=False)
    detacher = pg_connect()
    try:
        old_snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        old_snapshot.execute("SELECT count(*) FROM public.rr_parts")
        detacher.execute("SET statement_timeout = '1s'")
        with pytest.raises(Exception, match="statement timeout"):
            detacher.execute(
                f"ALTER TABLE public.rr_parts DETACH PARTITION public.{name} CONCURRENTLY"
            )
    finally:
        old_snapshot.rollback()
        old_snapshot.close()
        detacher.close()
    assert _pending(name)


def _pending(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(bool_or(inhdetachpending), false) FROM pg_inherits"
            " WHERE inhrelid = %s::regclass",
            [f"public.{name}"],
        )
        return cur.fetchone()[0]
