#!/usr/bin/env python
"""Fleet reconciler bench: what one reconciler pass (``retention reconcile``: the control
database's, then one per target) costs with N targets, each holding a drained run and an
active one, and with one more registered target that does not answer.

    RETENTION_DEMO=1 .venv/bin/python bench/fleet_reconcile.py [--targets 1,2,4,8]
                                                              [--passes 5] [--keep]

Builds a throwaway control database (``bench_fleet_reconcile``) on the project's embedded
server and one target database per target on an embedded server of the bench's own
(``.pgdata-fleet/bench``), each a copy of a database with the ledger (``tests.fleet.servers``).
For each N: 3,000 rows per target, one approved policy ``targets = ["group:bench"]``, one
period triggered and drained (``retention drain --until-idle``), a second period triggered
(active, its leases fresh: the pass looks at them and re-publishes nothing). Then
``--passes`` passes, timed one by one, and the control database's statements this process
sent per pass; then the same with a target registered whose address refuses connections.
Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("RETENTION_DEMO", "1")
os.environ["TEST_DATABASE_NAME"] = "bench_fleet_reconcile"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402

PERIODS = ("2026-11-29", "2026-11-30")
ROWS = 3000


class ControlStatements:
    """The statements this thread sends the control database (its connection ``default``)."""

    def __init__(self) -> None:
        self.count = 0
        connection_created.connect(self.watch, weak=False)
        if connection.connection is not None:
            self.watch(None, connection)

    def watch(self, sender, connection, **kwargs) -> None:
        if connection.alias == "default" and self.tally not in connection.execute_wrappers:
            connection.execute_wrappers.append(self.tally)

    def tally(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def cli(*args: str) -> str:
    out = StringIO()
    call_command("retention", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def timed_passes(passes: int, statements: ControlStatements) -> dict:
    from runs.fleet.reconcile import reconcile_everywhere

    seconds, sent, reports = [], [], []
    for _ in range(passes):
        before, t0 = statements.count, time.monotonic()
        reports.append(reconcile_everywhere())
        seconds.append(time.monotonic() - t0)
        sent.append(statements.count - before)
    return {"seconds": seconds, "statements": sent, "last": reports[-1]}


def one_round(n: int, server, template: str, people, statements, passes: int) -> dict:
    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec
    from runs.fleet import mirror
    from runs.models import Run
    from targets import connections as C
    from targets.models import Target
    from tests.factories import events_spec
    from tests.runs.conftest import create_events

    made = []
    Target.objects.all().delete()
    mirror.forget()
    for i in range(n):
        database = server.create_database(template=template)
        made.append(database)
        os.environ[f"BENCH_FLEET_{i}"] = server.admin_url(database)
        Target.objects.create(name=f"b{i}", dsn_env=f"BENCH_FLEET_{i}", group="bench")
        with C.on(f"b{i}"):
            create_events(ROWS, days=40, tenants=8)
    C.close_all()
    slug = f"reconcile-{n}"
    spec = PolicySpec.parse(
        events_spec(slug, targets=["group:bench"], chunking="key", chunk_size=500)
    )
    version = actions.apply_spec(spec, author=people["author"])
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=people["author"], reason="bench")
    actions.approve_version(version, actor=people["approver"], reason="bench")
    os.environ["RETENTION_TOKEN"] = people["token"]
    cli("trigger", slug, "--period", PERIODS[0])
    cli("drain", "--until-idle")
    cli("trigger", slug, "--period", PERIODS[1])  # active; its leases were just published
    states = []
    for i in range(n):
        with C.on(f"b{i}"):
            states.append(sorted(Run.objects.values_list("state", flat=True)))
    C.close_all()
    reachable = timed_passes(passes, statements)
    os.environ["BENCH_FLEET_GONE"] = "postgresql://postgres@127.0.0.1:9/none"
    Target.objects.create(name="gone", dsn_env="BENCH_FLEET_GONE", group="elsewhere")
    with_gone = timed_passes(passes, statements)
    Target.objects.filter(name="gone").delete()
    C.close_all()
    Policy.objects.filter(slug=slug).update(enabled=False)
    for database in made:
        server.drop_database(database)
    return {"targets": n, "states": states, "reachable": reachable, "gone": with_gone}


def report(results: list[dict], passes: int) -> None:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\n{passes} passes each; per target a drained run and an active one ({ROWS:,} rows);"
        f" load average {load}\n"
    )
    print(
        "| targets | pass ms (median) | pass ms (max) | ms per target | control statements"
        " per pass | + a target that refuses: pass ms (median) | its report |"
    )
    print("|--:|--:|--:|--:|--:|--:|--|")
    for r in results:
        ok, gone = r["reachable"], r["gone"]
        median = statistics.median(ok["seconds"]) * 1000
        print(
            f"| {r['targets']} | {median:.0f} | {max(ok['seconds']) * 1000:.0f} | "
            f"{median / r['targets']:.0f} | {statistics.median(ok['statements']):.0f} | "
            f"{statistics.median(gone['seconds']) * 1000:.0f} | "
            f"{str(gone['last']['targets'].get('gone'))[:70]} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="1,2,4,8")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}

    from bench.fleet_common import control_and_server

    with control_and_server(keep=args.keep) as (people, server, template):
        statements = ControlStatements()
        results = []
        for n in (int(x) for x in args.targets.split(",")):
            results.append(one_round(n, server, template, people, statements, args.passes))
            report(results, args.passes)


if __name__ == "__main__":
    main()
