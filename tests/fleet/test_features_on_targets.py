"""What a run does on the control database it does on a target too: expired partitions
dropped whole where nothing in them is held or kept (the rest deleted in chunks), and a
rollout's slice stage deleting only its slice — each judged against a snapshot of the
target's own table."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from retention import actions as policy_actions
from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, PartitionAction, Run
from targets import connections as C
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events
from tests.runs.test_cascades import create_orders, drop_orders
from tests.runs.test_partitions import EXPIRED, MONTHS, create_partitioned, parts_spec

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(query: str, params=()) -> set:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return {tuple(r) for r in cur.fetchall()}


def _exists(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [f"public.{name}"])
        return cur.fetchone()[0]


def _trigger(slug: str) -> str:
    (key,) = run_cli("trigger", slug, "--period", NOW.date().isoformat()).split()
    return key


@pytest.fixture
def parts_on(fleet):
    """``public.rr_parts`` (12 monthly partitions, kept rows in March) on the second target,
    whose server is not the control database's."""
    target = fleet[1]
    with C.on(target.name):
        create_partitioned()
    yield target
    with C.on(target.name), connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def _drain_one(key: str, target) -> None:
    """The command line drains every target; the run's status names its target."""
    run_cli("drain", "--until-idle", "--workers", "2")
    status = json.loads(run_cli("status", key, "--json"))
    assert status["target"] == target.name and status["state"] == "drained", status


def _audited(run: Run) -> int:
    return sum(AuditRecord.objects.filter(run=run).values_list("rows_deleted", flat=True))


def test_expired_partitions_on_a_target_go_whole_where_nothing_is_kept(
    parts_on, make_user, act_as, no_guard
):
    target = parts_on
    approved_policy(make_user, **parts_spec(targets=[target.name]))
    act_as(make_user("olga", "oncall"))
    key = _trigger("parts")
    assert key.startswith(f"{target.name}:parts/")
    _drain_one(key, target)
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        expected = _rows(
            "SELECT id FROM public.rr_parts_shadow"
            " WHERE NOT (occurred_at < %s AND status <> 'disputed')",
            [run.cutoff],
        )
        assert _rows("SELECT id FROM public.rr_parts") == expected
        dropped = set(
            PartitionAction.objects.filter(run=run, state="dropped").values_list("name", flat=True)
        )
        # March keeps its disputed rows (deleted in chunks); August straddles the cutoff
        assert dropped == {f"rr_parts_{m}" for m in EXPIRED if m != "2026_03"}
        for month in MONTHS:
            assert _exists(f"rr_parts_{month}") == (f"rr_parts_{month}" not in dropped)
        (total,) = next(iter(_rows("SELECT count(*) FROM public.rr_parts_shadow")))
        assert _audited(run) == total - len(expected)
        assert not verify_chain().problems
    # nothing of it happened on the control database
    assert not Run.objects.exists() and not PartitionAction.objects.exists()


def test_a_held_tenant_on_a_target_keeps_every_partition_it_is_in(
    parts_on, make_user, act_as, no_guard
):
    target = parts_on
    policy = approved_policy(make_user, **parts_spec(targets=[target.name]))
    policy_actions.place_hold(
        actor=make_user("hilde", "compliance"), reason="litigation", policy=policy, tenant="2"
    )
    act_as(make_user("olga", "oncall"))
    key = _trigger("parts")
    _drain_one(key, target)
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        expected = _rows(
            "SELECT id FROM public.rr_parts_shadow"
            " WHERE NOT (occurred_at < %s AND status <> 'disputed' AND tenant_id <> 2)",
            [run.cutoff],
        )
        assert _rows("SELECT id FROM public.rr_parts") == expected
        # tenant 2 has rows in every month: no partition went whole, every one is still there
        assert not PartitionAction.objects.filter(run=run, state="dropped").exists()
        assert all(_exists(f"rr_parts_{m}") for m in MONTHS)
        (total,) = next(iter(_rows("SELECT count(*) FROM public.rr_parts_shadow")))
        assert _audited(run) == total - len(expected)


def test_a_slice_stage_on_a_target_deletes_only_its_slice(fleet, make_user, act_as, no_guard):
    target = fleet[2]
    with C.on(target.name):
        create_events(2000, days=40)
    approved_policy(
        make_user,
        **events_spec(targets=[target.name], rollout="slice", slice="10 days", chunking="key"),
    )
    act_as(make_user("olga", "oncall"))
    key = _trigger("events")
    with C.on(target.name):
        before = _rows("SELECT id, occurred_at, status FROM public.rr_events")
    _drain_one(key, target)
    with C.on(target.name):
        run = Run.objects.get(run_key=key)
        assert run.rollout == "slice" and run.slice_bound is not None
        gone = {  # a NULL status is kept: the keep rule cannot tell
            r[0] for r in before if r[1] < run.slice_bound and r[2] not in (None, "disputed")
        }
        assert gone, "the slice has rows"
        assert {r[0] for r in _rows("SELECT id FROM public.rr_events")} == {
            r[0] for r in before
        } - gone
        assert _audited(run) == len(gone)


def test_a_cascade_on_a_target_spares_the_rows_another_policys_hold_and_keep_rule_protect(
    fleet, make_user, act_as, no_guard
):
    """The orders policy's chunks cascade into the lines, which another policy over the same
    target holds (tenant 9) and keeps ('disputed'): its decisions reach the target's mirror
    though no run of it exists there."""
    target = fleet[0]
    with C.on(target.name):
        create_orders()
    try:
        lines = approved_policy(
            make_user, slug="lines", table="public.rr_order_lines", key="id",
            timestamp="updated_at", tenant="tenant_id", retention="10 days",
            schedule="0 4 * * *", timezone="UTC", targets=[target.name],
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
        )  # fmt: skip
        policy_actions.place_hold(
            actor=make_user("keeper", "compliance"), reason="case 18", policy=lines, tenant="9"
        )
        approved_policy(
            make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
            tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
            chunk_size=100, chunking="key", cascade_ack=["public.rr_order_lines"],
            targets=[target.name],
        )  # fmt: skip
        act_as(make_user("olga", "oncall"))
        key = _trigger("orders")
        lines_cutoff = NOW.replace(day=20)
        protected = "tenant_id = 9 OR status = 'disputed' OR updated_at >= %s"
        with C.on(target.name):
            protected_before = _rows(
                f"SELECT id FROM public.rr_order_lines WHERE {protected}", [lines_cutoff]
            )
            lines_before = _rows("SELECT id FROM public.rr_order_lines")
            assert len(protected_before) > 300
        _drain_one(key, target)
        with C.on(target.name):
            run = Run.objects.get(run_key=key)
            lines_after = _rows("SELECT id FROM public.rr_order_lines")
            assert protected_before <= lines_after  # no protected line went with its order
            assert lines_after < lines_before  # and the unprotected lines of old orders did
            # an order goes only when none of its lines is protected; odd orders have none
            assert not _rows(
                "SELECT id FROM public.rr_orders WHERE id %% 2 = 1 AND placed_at < %s",
                [run.cutoff],
            )
            assert not _rows(
                "SELECT o.id FROM public.rr_orders_shadow o JOIN public.rr_order_lines l"
                " ON l.order_id = o.id WHERE l.id IN (SELECT id FROM public.rr_order_lines)"
                " EXCEPT SELECT id FROM public.rr_orders"
            )  # no surviving line lost its order
            by_table: dict[str, int] = {}
            for record in AuditRecord.objects.filter(run=run):
                for name, rows in (record.table_rows or {}).items():
                    by_table[name] = by_table.get(name, 0) + rows
            assert by_table["public.rr_order_lines"] == len(lines_before) - len(lines_after)
            assert not verify_chain().problems
    finally:
        with C.on(target.name):
            drop_orders()
