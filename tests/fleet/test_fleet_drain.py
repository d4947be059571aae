"""One policy over a group of three targets on three PostgreSQL servers: each drains exactly."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import call_command
from django.db import connection

from retention import actions as policy_actions
from runs.evidence.audit import verify_chain
from runs.models import AuditRecord, Run
from targets import connections as C
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 3000


def _eligible(cutoff, held_tenant: str | None = None) -> set[int]:
    """What the policy may delete, read now: old, not kept (a NULL status is kept: the keep
    rule cannot tell), not held."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id FROM public.rr_events WHERE occurred_at < %s"
            " AND status <> 'disputed' AND (%s::text IS NULL OR tenant_id::text <> %s)",
            [cutoff, held_tenant, held_tenant],
        )
        return {r[0] for r in cur.fetchall()}


def _ids() -> set[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM public.rr_events")
        return {r[0] for r in cur.fetchall()}


def test_one_policy_over_a_group_of_three_targets_drains_each_exactly(
    fleet, make_user, act_as, no_guard
):
    for target in fleet:
        with C.on(target.name):
            create_events(ROWS, days=40)
    oncall = make_user("olga", "oncall")
    compliance = make_user("hilde", "compliance")
    policy = approved_policy(
        make_user, **events_spec(targets=["group:shards"], chunking="key", chunk_size=300)
    )
    # a hold on tenant 3 of this policy, placed on the control database before the trigger
    policy_actions.place_hold(actor=compliance, reason="litigation", policy=policy, tenant="3")

    act_as(oncall)
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    assert [k.split(":")[0] for k in keys] == ["shard1", "shard2", "shard3"]
    assert all(re.match(r"^shard\d:events/", k) for k in keys)

    before = {}
    for target in fleet:
        with C.on(target.name):
            run = Run.objects.get(run_key=f"{target.name}:" + keys[0].split(":", 1)[1])
            before[target.name] = (_ids(), _eligible(run.cutoff, held_tenant="3"))

    run_cli("drain", "--until-idle", "--workers", "2")

    for target, key in zip(fleet, keys, strict=True):
        status = json.loads(run_cli("status", key, "--json"))
        assert status["target"] == target.name
        assert status["state"] == "drained", status
        with C.on(target.name):
            ids, eligible = before[target.name]
            assert eligible, "the snapshot has eligible rows"
            left = _ids()
            # every eligible row gone, nothing else
            assert left == ids - eligible
            # held rows (tenant 3) kept although old
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM public.rr_events WHERE tenant_id = 3 AND occurred_at < %s",
                    [Run.objects.get(run_key=key).cutoff],
                )
                assert cur.fetchone()[0] > 0
            total = sum(AuditRecord.objects.values_list("rows_deleted", flat=True))
            assert total == len(eligible)
            report = verify_chain()
            assert not report.problems
            assert report.records == AuditRecord.objects.count() > 0
    # the control database deleted nothing and holds no run of these targets
    assert not Run.objects.exists()


def test_a_target_without_the_ledger_is_refused_at_trigger(fleet, make_user, act_as, no_guard):
    bare = fleet[0].server
    database = bare.create_database()
    try:
        url = bare.admin_url(database)
        import os

        os.environ["FLEET_TEST_BARE"] = url
        from targets.models import Target

        for target in fleet:
            with C.on(target.name):
                create_events(200, days=40)
        act_as(make_user("otto", "oncall"))
        policy = approved_policy(make_user, **events_spec(targets=["group:shards"]))
        Target.objects.create(name="bare", dsn_env="FLEET_TEST_BARE", group="shards")
        with pytest.raises(
            Exception, match=r"target bare has no ledger: run `retention target migrate bare`"
        ):
            call_command("retention", "trigger", policy.slug, "--period", NOW.date().isoformat())
        for target in fleet:  # nothing was created anywhere
            with C.on(target.name):
                assert not Run.objects.exists()
    finally:
        os.environ.pop("FLEET_TEST_BARE", None)
        C.close_all()
        bare.drop_database(database)
