#!/usr/bin/env python
"""Fleet bench: one policy over N targets drained by 2 workers, against one target of the same
total size, and the control database's own load while they drain.

    RETENTION_DEMO=1 .venv/bin/python bench/fleet.py [--targets 2,4,8] [--rows 120000]
                                                    [--chunk-size 2000] [--keep]
                                                    [--window S] [--planned]

Builds a throwaway control database (``bench_fleet``) on the project's embedded server and
one target database per target on an embedded server of the bench's own (``.pgdata-fleet/
bench``: the targets share its one server and the machine's cores), each a copy of a database
with the ledger installed by ``migrate`` (``tests.fleet.servers``). For each N: ``--rows``
rows in all, split evenly over the N targets (about 60% eligible), one approved policy
``targets = ["group:bench"]``, ``retention trigger`` (one run per target) and ``retention
drain --until-idle --workers 2`` in this process. N = 1 is the baseline: one target of the
same total size.

The table: rows deleted per second over the whole drain and against the baseline; the control
database's transactions (``pg_stat_database.xact_commit + xact_rollback``, read once every
session of the drain has ended: ``tests.fleet.control_load``) and the statements this process
sent it (every thread's control connection) during the drain, per second and per chunk.
``--window S`` sets the gate's window (``RETENTION_GATE_WINDOW_S``; 0: one control transaction
per chunk); ``--planned`` plans every run whole before the drain, so that the chunks are
``--chunk-size`` keys each (none adapts) and their number is the same from run to run. Prints
tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("RETENTION_DEMO", "1")
os.environ["TEST_DATABASE_NAME"] = "bench_fleet"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402

PERIOD = "2026-11-30"


class ControlStatements:
    """The statements every thread of this process sends the control database (its Django
    connections named ``default``; a target's are named ``target:NAME``)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        connection_created.connect(self.watch, weak=False)

    def watch(self, sender, connection, **kwargs) -> None:
        if connection.alias == "default" and self.tally not in connection.execute_wrappers:
            connection.execute_wrappers.append(self.tally)

    def tally(self, execute, sql, params, many, context):
        with self.lock:
            self.count += 1
        return execute(sql, params, many, context)


STATEMENTS: ControlStatements | None = None


def cli(*args: str) -> str:
    out = StringIO()
    call_command("retention", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def one_round(
    n: int, rows: int, chunk_size: int, server, template: str, people, counter, *, planned: bool
) -> dict:
    """N targets of ``rows // n`` rows each, one policy over them, drained by 2 workers."""
    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec
    from runs.fleet import mirror
    from runs.models import AuditRecord, Chunk
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
            create_events(rows // n, days=40, tenants=8)
    C.close_all()
    slug = f"fleet-{n}"
    spec = PolicySpec.parse(
        events_spec(slug, targets=["group:bench"], chunking="key", chunk_size=chunk_size,
                    limits={"policy_workers": 2, "tenant_workers": 1})
    )  # fmt: skip
    version = actions.apply_spec(spec, author=people["author"])
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=people["author"], reason="bench")
    actions.approve_version(version, actor=people["approver"], reason="bench")
    os.environ["RETENTION_TOKEN"] = people["token"]
    keys = cli("trigger", slug, "--period", PERIOD).split()
    if planned:  # every chunk planned before the drain, at the policy's size
        from runs.engine import planner
        from runs.models import Run

        for i in range(n):
            with C.on(f"b{i}"):
                for run in Run.objects.filter(state=Run.State.ACTIVE):
                    while not run.planner_done:
                        planner.plan(run, window=1_000_000)
                        run.refresh_from_db()
    C.close_all()
    connections.close_all()
    before = counter.read()
    sent, t0 = STATEMENTS.count, time.monotonic()
    cli("drain", "--until-idle", "--workers", "2")
    seconds = time.monotonic() - t0
    sent = STATEMENTS.count - sent
    C.close_all()
    connections.close_all()  # the drain's sessions end: their counts are in
    control = counter.read() - before
    deleted = chunks = 0
    for i in range(n):
        with C.on(f"b{i}"):
            deleted += sum(AuditRecord.objects.values_list("rows_deleted", flat=True))
            chunks += Chunk.objects.filter(state="done").count()
    C.close_all()
    Policy.objects.filter(slug=slug).update(enabled=False)
    for database in made:
        server.drop_database(database)
    return {"targets": n, "runs": len(keys), "rows": deleted, "chunks": chunks,
            "seconds": seconds, "control": control, "statements": sent}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="2,4,8")
    parser.add_argument("--rows", type=int, default=120_000)
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--window", type=float, default=None, help="the gate's window, seconds")
    parser.add_argument(
        "--planned",
        action="store_true",
        help="plan every run whole before the drain (chunks of --chunk-size, none adapts)",
    )
    args = parser.parse_args()
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    if args.window is not None:
        settings.RETENTION["GATE_WINDOW_S"] = args.window
    global STATEMENTS
    STATEMENTS = ControlStatements()

    from bench.fleet_common import control_and_server
    from tests.fleet.control_load import ControlTransactions

    with control_and_server(keep=args.keep) as (people, server, template):
        results = []
        counter = ControlTransactions(end_lingering=False)
        for n in [1, *(int(x) for x in args.targets.split(","))]:
            results.append(
                one_round(
                    n,
                    args.rows,
                    args.chunk_size,
                    server,
                    template,
                    people,
                    counter,
                    planned=args.planned,
                )  # fmt: skip
            )
            report(results, args)
        counter.close()


def report(results: list[dict], args) -> None:
    base = results[0]["rows"] / results[0]["seconds"]
    window = settings.RETENTION["GATE_WINDOW_S"]
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\n{args.rows:,} rows in all, chunks of {args.chunk_size}, 2 workers (one process),"
        f" gate window {window:g} s{', planned whole before the drain' if args.planned else ''},"
        f" load average {load}\n"
    )
    print("| targets | runs | rows deleted | chunks | seconds | rows/s | × one target |"
          " control tx | control tx/s | control tx per chunk | control statements |"
          " statements/s | statements per chunk |")  # fmt: skip
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results:
        rate = r["rows"] / r["seconds"]
        chunks = max(1, r["chunks"])
        print(
            f"| {r['targets']} | {r['runs']} | {r['rows']:,} | {r['chunks']:,} | "
            f"{r['seconds']:.1f} | {rate:,.0f} | {rate / base:.2f} | {r['control']:,} | "
            f"{r['control'] / r['seconds']:,.0f} | {r['control'] / chunks:.2f} | "
            f"{r['statements']:,} | {r['statements'] / r['seconds']:,.0f} | "
            f"{r['statements'] / chunks:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
