"""A count run against the full run it stands for, on one fresh table in the dev database:
rows counted and deleted, wall time, and the time of each chunk — a count run's count
statement (one short statement per chunk, like the DELETE it replaces), a full run's chunk
transaction (its audit record's start to commit).

    RETENTION_DEMO=1 .venv/bin/python bench/rollout.py [--rows 500000] [--chunk 5000]

Drains inline in this process (one worker, guard on). Prints a Markdown table. The table
``public.rr_bench_rollout`` and the policies ``bench-count``/``bench-full`` are made afresh
each time (the users ``bench-author``/``bench-approver`` are created when missing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.db import connection  # noqa: E402

from retention import actions  # noqa: E402
from retention.models import Policy  # noqa: E402
from retention.spec import PolicySpec  # noqa: E402
from runs.actions import trigger_run  # noqa: E402
from runs.counts import count_totals  # noqa: E402
from runs.engine import worker  # noqa: E402
from runs.models import AuditRecord, Run  # noqa: E402

TABLE = "rr_bench_rollout"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _table(rows: int) -> None:
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{TABLE}")
        cur.execute(
            f"CREATE TABLE public.{TABLE} (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text, payload text)"
        )
        cur.execute(
            f"INSERT INTO public.{TABLE} SELECT g, 1 + g %% 20,"
            " %s::timestamptz - make_interval(secs => 40 * 86400.0 * (1 - g::float8 / %s)),"
            " CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed' END, repeat('x', 60)"
            " FROM generate_series(1, %s) AS g",
            [NOW, rows, rows],
        )
        cur.execute(f"CREATE INDEX ON public.{TABLE} (occurred_at)")
        cur.execute(f"VACUUM ANALYZE public.{TABLE}")


def _user(name: str) -> User:
    user = User.objects.filter(username=name).first() or User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name="compliance")[0])
    return user


def _policy(slug: str, rollout: str, chunk: int) -> Policy:
    for run in Run.objects.filter(policy__slug=slug).exclude(state__in=Run.TERMINAL):
        Run.objects.filter(pk=run.pk).update(state=Run.State.CANCELLED)
    spec = PolicySpec.parse(
        dict(
            slug=slug, table=f"public.{TABLE}", key="id", timestamp="occurred_at",
            tenant="tenant_id", retention="20 days", schedule="0 3 * * *", chunk_size=chunk,
            chunking="key", rollout=rollout, blast_radius=1000.0, limits={"policy_workers": 1, "tenant_workers": 1},
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
        )
    )  # fmt: skip
    author, approver = _user("bench-author"), _user("bench-approver")
    version = actions.apply_spec(spec, author=author)
    if version.state == "draft":
        version = actions.submit_version(version, actor=author, reason="bench")
    if version.state == "submitted":
        actions.approve_version(version, actor=approver, reason="bench")
    return Policy.objects.get(slug=slug)


def _drain(policy: Policy, tick: datetime) -> tuple[Run, float, list[float]]:
    run, _ = trigger_run(policy, tick=tick)
    seconds: list[float] = []

    def timed(execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if TABLE in sql and sql.lstrip().startswith("SELECT tn"):  # a chunk's count
                seconds.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with connection.execute_wrapper(timed):
        while worker.drain(run.pk, budget_s=600)["continue"]:
            pass
    wall = time.perf_counter() - t0
    run.refresh_from_db()
    return run, wall, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--chunk", type=int, default=5000)
    args = parser.parse_args()
    _table(args.rows)
    # a new period each time (a run key names the minute): after every earlier bench run
    earlier = Run.objects.filter(policy__slug__in=("bench-count", "bench-full")).count()
    tick = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=earlier)
    count_policy = _policy("bench-count", "count", args.chunk)
    full_policy = _policy("bench-full", "full", args.chunk)
    counted, count_s, count_stmts = _drain(count_policy, tick)
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM public.{TABLE}")
        (before,) = cur.fetchone()
    drained, full_s, _pipelined = _drain(full_policy, tick)
    # a DELETE goes to the server in a pipeline (its execute returns at once): each chunk
    # transaction's own time is its audit record's, from its start to its commit
    delete_stmts = [
        (a.committed_at - a.started_at).total_seconds()
        for a in AuditRecord.objects.filter(run=drained)
    ]
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM public.{TABLE}")
        (after,) = cur.fetchone()
    rows_counted = count_totals(counted)["rows"]

    def ms(values: list[float], q: float) -> str:
        if not values:
            return "—"
        ordered = sorted(values)
        return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"

    print(f"\n{args.rows:,} rows, chunks of {args.chunk:,}, one worker, guard on\n")
    print("| run | state | rows | chunks | wall s | p50 ms | p95 ms | max ms |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| count | {counted.state} | {rows_counted:,} counted, 0 deleted | {len(count_stmts)} |"
        f" {count_s:.1f} | {ms(count_stmts, 0.5)} | {ms(count_stmts, 0.95)} |"
        f" {ms(count_stmts, 1.0)} |"
    )
    print(
        f"| full | {drained.state} | {before - after:,} deleted | {len(delete_stmts)} |"
        f" {full_s:.1f} | {ms(delete_stmts, 0.5)} | {ms(delete_stmts, 0.95)} |"
        f" {ms(delete_stmts, 1.0)} |"
    )
    print(f"\ncounted == deleted: {rows_counted == before - after}")


if __name__ == "__main__":
    main()
