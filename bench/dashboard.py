#!/usr/bin/env python
"""Dashboard benchmark: page latency and evidence-export throughput on a large ledger.

    RETENTION_DEMO=1 .venv/bin/python bench/dashboard.py [--chunks 100000] [--audit 1000000]
                                                        [--requests 50] [--keep]
                                                        [--explain] [--vacuum]
                                                        [--drain-rows 20000000] [--no-drain]
                                                        [--drain-pace ROWS_PER_S]
    RETENTION_DEMO=1 .venv/bin/python bench/dashboard.py --fleet 8 [--fleet-rows 1000000]
                                                        [--fleet-pace 3000] [--requests 50]

Builds a throwaway database (``bench_dashboard``, dropped at the end unless --keep) with
set-based SQL: one active run of ``--chunks`` chunks (half done), earlier drained runs
holding the rest of ``--audit`` audit rows (each audit row has its own chunk: audit is
one-to-one with chunks), five policies. Audit rows are inserted directly, outside the
hash chain (the append-only trigger only rejects UPDATE and DELETE).

Then, unless --no-drain, every page and fragment again while a real run drains: a table of
``--drain-rows`` rows (tenants interleaved, so ``auto`` chunks by key range across them), a
policy approved and triggered like any other, and two ``retention drain`` worker processes
deleting it while the pages are requested. The table says how many rows the workers deleted
during each page's requests, so a page measured after the run drained shows it (the
default 20M rows keep two unpaced workers deleting through every page on a 2-core machine).

``--fleet N``: instead, the fleet's pages with N targets (databases on an embedded server of
the bench's own, ``.pgdata-fleet/bench``, each with the ledger) and one policy over all of them
(``targets = ["group:fleet"]``, paced by ``--fleet-pace``): N - 2 targets drained before the
measurements, two drained by two ``retention drain`` worker processes while the overview, the
overview of that policy, the policy's page, its targets' fragment, the targets page and a
target's page are timed. Then a further target of the group whose server does not answer (a
socket that accepts and never replies, as a hung server or a dropped network path does):
each page's first request after it joined and again a second later, what the page says of
it, the connection attempts it received, and the p95 with it in place. The fleet's share of
the overview is timed apart (``runs.fleet.view.fleet_of`` alone: the pages show each
target's last reading, taken in the background) and so is one ledger's background read;
with ``--explain``, the overview's control-database queries and a profile of its own time.
Each page's row has its wall-clock ms, the request thread's own CPU ms (the web process's
work, without the waits of a busy machine) and its control-database statements.

Prints tables; asserts nothing. Targets: page p95 <= 150 ms, CSV >= 100k rows/s, flat RSS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("RETENTION_DEMO", "1")
os.environ["TEST_DATABASE_NAME"] = "bench_dashboard"

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE / 2**20


def build(chunks: int, audit_rows: int, vacuum: bool = False) -> dict:
    from datetime import timedelta

    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from retention import actions
    from retention.spec import PolicySpec
    from runs.models import Run

    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.bench_events")
        cur.execute(
            """CREATE TABLE public.bench_events (id bigint PRIMARY KEY, tenant_id int NOT NULL,
               occurred_at timestamptz NOT NULL, status text)"""
        )
        cur.execute(
            """INSERT INTO public.bench_events SELECT g, g %% 7,
               now() - make_interval(days => 60) + make_interval(secs => g * 50), 'closed'
               FROM generate_series(1, %s) g""",
            [20_000],
        )
        cur.execute("CREATE INDEX ON public.bench_events (tenant_id, id)")
        cur.execute("CREATE INDEX ON public.bench_events (occurred_at)")
        cur.execute("ANALYZE public.bench_events")
    groups = {n: Group.objects.get_or_create(name=n)[0] for n in ("compliance", "viewer")}
    author = User.objects.create_user("bench-author", password="x")
    approver = User.objects.create_user("bench-approver", password="x")
    author.groups.add(groups["compliance"])
    approver.groups.add(groups["compliance"])
    admin = User.objects.create_superuser("bench-admin", password="x")
    policies = []
    for i in range(5):
        spec = PolicySpec.parse(
            dict(
                slug=f"bench-{i}", table="public.bench_events", key="id", timestamp="occurred_at",
                tenant="tenant_id", retention="30 days", schedule="0 3 * * *", timezone="UTC",
                chunk_size=1000,
            )
        )  # fmt: skip
        version = actions.apply_spec(spec, author=author)
        version = actions.submit_version(version, actor=author, reason="bench")
        actions.approve_version(version, actor=approver, reason="bench")
        policies.append(version.policy)
    policy = policies[0]
    version = policy.approved_version
    now = timezone.now()
    history_chunks = max(0, audit_rows - chunks // 2)
    history_runs = 19
    runs = []
    for i in range(history_runs):
        tick = now - timedelta(days=history_runs - i)
        runs.append(
            Run.objects.create(
                run_key=f"{policy.slug}/hist-{i}", policy=policy, policy_version=version,
                tick=tick, cutoff=tick - timedelta(days=30), state=Run.State.DRAINED,
                started_at=tick, finished_at=tick + timedelta(hours=1), planner_done=True,
            )
        )  # fmt: skip
    current = Run.objects.create(
        run_key=f"{policy.slug}/current", policy=policy, policy_version=version, tick=now,
        cutoff=now - timedelta(days=30), state=Run.State.ACTIVE, started_at=now,
        expected_rows=chunks * 1000, planner_done=True,
    )  # fmt: skip
    per_run = history_chunks // history_runs
    with connection.cursor() as cur:
        # Earlier runs: every chunk done.
        cur.execute(
            """INSERT INTO runs_chunk (run_id, pass_no, tenant, seq, key_from, key_to, planned_rows,
                   state, attempts, not_before, last_error, last_sqlstate, throttle_reason,
                   created_at, done_at)
               SELECT r.id, 1, (g %% 7)::text, g, g * 1000, g * 1000 + 1000, 1000, 'done',
                      CASE WHEN g %% 50 = 0 THEN 2 ELSE 1 END, r.tick, '', '', '', r.tick, r.tick
               FROM unnest(%s::bigint[]) AS r_id
               JOIN runs_run r ON r.id = r_id
               CROSS JOIN generate_series(1, %s) AS g""",
            [[r.pk for r in runs], per_run],
        )
        # The current run: half done, the rest pending (a few throttled, a few dead).
        cur.execute(
            """INSERT INTO runs_chunk (run_id, pass_no, tenant, seq, key_from, key_to, planned_rows,
                   state, attempts, not_before, last_error, last_sqlstate, throttle_reason,
                   created_at, done_at)
               SELECT %s, 1, (g %% 7)::text, g, g * 1000, g * 1000 + 1000, 1000,
                      CASE WHEN g <= %s THEN 'done' WHEN g %% 5000 = 0 THEN 'dead'
                           ELSE 'pending' END,
                      CASE WHEN g <= %s THEN 1 + (g %% 97 = 0)::int ELSE 0 END,
                      CASE WHEN g > %s AND g %% 1000 = 1 THEN now() + interval '1 minute'
                           ELSE now() - interval '1 hour' END,
                      '', '',
                      CASE WHEN g > %s AND g %% 1000 = 1 THEN 'probe p95 41 ms > 25 ms' ELSE '' END,
                      now() - interval '1 hour' + make_interval(secs => g * 0.05),
                      CASE WHEN g <= %s THEN now() - interval '1 hour' + make_interval(secs => g * 0.05) END
               FROM generate_series(1, %s) AS g""",
            [current.pk, chunks // 2, chunks // 2, chunks // 2, chunks // 2, chunks // 2, chunks],
        )
        # One audit row per done chunk, outside the hash chain.
        cur.execute(
            """INSERT INTO runs_auditrecord (chain_seq, chunk_id, run_id, policy_version_id,
                   policy_slug, table_name, cutoff, tenant, key_from, key_to, attempt, worker_host,
                   worker_pid, rows_deleted, started_at, committed_at, outcome, prev_hash, hash,
                   chain_version, run_key, version_hash, approval_reason)
               SELECT row_number() OVER (ORDER BY c.id), c.id, c.run_id, %s, %s,
                      'public.bench_events', r.cutoff, c.tenant, c.key_from, c.key_to, c.attempts,
                      'bench-host', 4242, 900 + (c.id %% 100), c.done_at - interval '12 ms',
                      c.done_at, 'deleted', md5(c.id::text) || md5((c.id - 1)::text),
                      md5(c.id::text || 'x') || md5(c.id::text || 'y'), 2, r.run_key, '', ''
               FROM runs_chunk c JOIN runs_run r ON r.id = c.run_id
               WHERE c.state = 'done'""",
            [version.pk, policy.slug],
        )
        # --vacuum: what autovacuum does soon after a bulk insert (sets the visibility map, so
        # the covering indexes can answer progress's aggregates without visiting the heap)
        analyze = "VACUUM (ANALYZE)" if vacuum else "ANALYZE"
        cur.execute(f"{analyze} runs_chunk")
        cur.execute(f"{analyze} runs_auditrecord")
        cur.execute("ANALYZE runs_run")
        cur.execute("SELECT count(*) FROM runs_chunk WHERE run_id = %s", [current.pk])
        current_chunks = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM runs_chunk")
        all_chunks = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM runs_auditrecord")
        audit_count = cur.fetchone()[0]
    return {
        "admin": admin,
        "current": current,
        "current_chunks": current_chunks,
        "all_chunks": all_chunks,
        "audit_rows": audit_count,
    }


def build_draining(rows: int, pace: int = 0):
    """A policy on a fresh table of ``rows`` rows (all but a tenth past the cutoff, tenants
    interleaved), approved by two people and triggered: the run the workers drain."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from retention import actions
    from retention.spec import PolicySpec
    from runs.actions import trigger_run

    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.bench_drain")
        cur.execute(
            """CREATE TABLE public.bench_drain (id bigint PRIMARY KEY, tenant_id int NOT NULL,
               occurred_at timestamptz NOT NULL, status text)"""
        )
        cur.execute(
            """INSERT INTO public.bench_drain SELECT g, g %% 13,
               now() - make_interval(days => 40) + make_interval(secs => g * (11.0 * 86400 / %s)),
               CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed' END
               FROM generate_series(1, %s) g""",
            [rows, rows],
        )
        cur.execute("CREATE INDEX ON public.bench_drain (occurred_at)")
        cur.execute("CREATE INDEX ON public.bench_drain (tenant_id, id)")
        # what autovacuum would do to a freshly loaded table, done now: otherwise it runs on
        # the target during the measurements and the guard (autovacuum_running) holds the
        # workers back, so nothing drains while the pages are timed
        cur.execute("VACUUM (ANALYZE) public.bench_drain")
    author = User.objects.get(username="bench-author")
    approver = User.objects.get(username="bench-approver")
    spec = PolicySpec.parse(
        dict(
            slug="bench-drain", name="Drain bench", table="public.bench_drain", key="id",
            timestamp="occurred_at", tenant="tenant_id", retention="30 days",
            schedule="0 3 * * *", timezone="UTC", chunk_size=500,
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
            limits={"policy_workers": 2}, pace_rows_per_s=pace,
        )
    )  # fmt: skip
    version = actions.apply_spec(spec, author=author)
    version = actions.submit_version(version, actor=author, reason="bench")
    actions.approve_version(version, actor=approver, reason="bench")
    run, _ = trigger_run(version.policy, tick=timezone.now())
    return run


def deleted_so_far(run) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(rows_deleted), 0) FROM runs_auditrecord WHERE run_id = %s",
            [run.pk],
        )
        return int(cur.fetchone()[0])


def start_workers(run, n: int = 2) -> list[subprocess.Popen]:
    """``n`` ``retention drain --until-idle`` processes on the bench database (their own
    connections, as qcluster workers would be), draining ``run`` until it has no work.

    ``--until-idle`` matters: without it a drain process ends at the first moment nothing is
    admissible — a guard throttle (autovacuum or autoanalyze on the target after a few hundred
    thousand deletes, a slow probe on a loaded machine) or both chunks of the policy's two
    workers in flight — and the run stays active with nobody deleting (an earlier bench stopped
    so after 582k of 5M rows). With it, a process waits and tries again, as a lease would."""
    from bench.common import server_url, with_database

    url = with_database(server_url(), connection.settings_dict["NAME"])
    env = dict(os.environ, DATABASE_URL=url, RETENTION_DEMO="1", LOG_LEVEL="WARNING")
    env.pop("TEST_DATABASE_NAME", None)
    args = [sys.executable, str(ROOT / "manage.py"), "retention", "drain", run.run_key]
    args += ["--budget", "600", "--workers", "1", "--until-idle"]
    return [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL) for _ in range(n)]


def pages(run_id: int, drain_run_id: int | None = None) -> list[tuple[str, str, dict]]:
    """(name, URL, headers) of every page and fragment."""
    hx = {"HTTP_HX_REQUEST": "true"}
    out = [
        ("overview (full page)", "/", {}),
        ("overview (HTMX fragment)", "/", hx),
        ("overview ?policy=bench-0", "/?policy=bench-0", {}),
        ("run page (full)", f"/runs/{run_id}/", {}),
        ("run page (HTMX fragment)", f"/runs/{run_id}/", hx),
    ]
    if drain_run_id is not None:
        out += [
            ("draining run page (full)", f"/runs/{drain_run_id}/", {}),
            ("draining run page (HTMX fragment)", f"/runs/{drain_run_id}/", hx),
        ]
    out += [
        ("runs list", "/runs/", {}),
        ("dead letters", "/runs/dead-letters/", {}),
        ("activity", "/runs/activity/", {}),
        ("policies", "/policies/", {}),
        ("policies (HTMX fragment)", "/policies/", hx),
        ("policy page", "/policies/bench-0/", {}),
        ("approvals", "/policies/approvals/", {}),
        ("legal holds", "/policies/holds/", {}),
        ("audit page (first 200)", "/runs/audit/", {}),
    ]
    return out


def timed_gets(client: Client, url: str, n: int, **headers) -> dict:
    """``n`` requests of ``url``: wall-clock ms (p50, p95, max), the request thread's own CPU ms
    (p50, p95: what the page costs the web process, without the time it waited for a core on
    a busy machine or for the database) and the queries of one request."""
    client.get(url, **headers)  # warm caches and connections
    statements = [0]

    def count(execute, sql, params, many, context):
        statements[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        client.get(url, **headers)
    times, cpu = [], []
    for _ in range(n):
        start, start_cpu = time.perf_counter(), time.thread_time()
        response = client.get(url, **headers)
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    times.sort()
    cpu.sort()
    return {
        "p50": statistics.median(times),
        "p95": times[max(0, round(0.95 * len(times)) - 1)],
        "max": times[-1],
        "cpu_p50": statistics.median(cpu),
        "cpu_p95": cpu[max(0, round(0.95 * len(cpu)) - 1)],
        "queries": statements[0],
    }


def _plan_nodes(node: dict) -> list[str]:
    """A plan's nodes, depth first: "Seq Scan runs_chunk", "Index Scan audit_run", …"""
    rel = node.get("Relation Name") or node.get("Index Name") or ""
    out = [f"{node['Node Type']}{' ' + rel if rel else ''}"]
    for child in node.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out


def explain(client: Client, url: str, top: int = 6) -> None:
    """Every query the page runs, re-run under EXPLAIN (ANALYZE, BUFFERS): the count and the
    slowest ones with their plan's first lines (where an index is missing, it shows)."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    from django.db import DatabaseError, transaction

    timed, failed = [], []
    with connection.cursor() as cur:
        for q in captured.captured_queries:
            sql = q["sql"]
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            try:
                with transaction.atomic():
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
                    plan = cur.fetchone()[0][0]
            except DatabaseError as exc:  # one the page ran and the database refused
                failed.append((str(exc).splitlines()[0], sql))
                continue
            timed.append((plan["Execution Time"], sql, plan["Plan"]))
    timed.sort(key=lambda t: -t[0])
    total = sum(t[0] for t in timed)
    print(f"\n{url}: {len(captured)} queries, {total:.1f} ms of execution in all; slowest:")
    for ms, sql, node in timed[:top]:
        kinds = _plan_nodes(node)
        print(f"  {ms:8.1f} ms  {' > '.join(kinds[:5])}")
        print(f"             {' '.join(sql.split())[:160]}")
    for error, sql in failed:
        print(f"  refused: {error}")
        print(f"             {' '.join(sql.split())[:160]}")


def profile(client: Client, url: str, n: int, top: int = 14) -> None:
    """Where a page's own time goes: cProfile over ``n`` requests, the functions of the
    product (and Django's template rendering) with the most cumulative time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        client.get(url)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, func), (_cc, calls, _tt, cum, _callers) in stats.stats.items():
        here = str(ROOT) in path and "/.venv/" not in path
        if here or func in ("render", "_render") and "django/template" in path:
            rows.append((cum, calls, f"{Path(path).name}:{line} {func}"))
    rows.sort(reverse=True)
    print(f"\n{url}: cumulative ms per request (cProfile, {n} requests), the heaviest:")
    for cum, calls, where in rows[:top]:
        print(f"  {cum * 1000 / n:8.1f} ms  {calls / n:6.1f} calls  {where}")


def stream(client: Client, url: str) -> dict:
    rss_start = rss_mb()
    peak = rss_start
    start = time.perf_counter()
    cpu_start = time.process_time()
    response = client.get(url)
    assert response.status_code == 200 and response.streaming
    lines = 0
    size = 0
    rss_at_100k = None
    for i, piece in enumerate(response.streaming_content):
        lines += piece.count(b"\n")
        size += len(piece)
        if i % 20 == 0:
            peak = max(peak, rss_mb())
        if rss_at_100k is None and lines >= 100_000:
            rss_at_100k = peak
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    peak = max(peak, rss_mb())
    return {
        "rows": lines - 1,
        "seconds": seconds,
        "rows_per_s": (lines - 1) / seconds if seconds else 0,
        "rows_per_cpu_s": (lines - 1) / cpu if cpu else 0,
        "mb": size / 2**20,
        "rss_start": rss_start,
        "rss_peak": peak,
        "rss_at_100k": rss_at_100k,
    }


def measure_draining(client: Client, idle_run, rows: int, n: int, pace: int = 0) -> None:
    """Every page and fragment while two worker processes drain a real run."""
    from django.utils import timezone

    from runs.models import Run

    t0 = time.perf_counter()
    drain = build_draining(rows, pace)
    print(
        f"\n» built bench_drain ({rows:,} rows) and run {drain.run_key} ({drain.state}) "
        f"in {time.perf_counter() - t0:.1f} s; starting two drain workers",
        flush=True,
    )
    workers = start_workers(drain)
    try:
        deadline = time.monotonic() + 120
        while deleted_so_far(drain) == 0 and time.monotonic() < deadline:
            if all(w.poll() is not None for w in workers):
                raise SystemExit("the drain workers exited before deleting anything")
            time.sleep(0.2)
        start_rows = deleted_so_far(drain)
        print(f"» first chunks committed ({start_rows:,} rows); measuring", flush=True)
        results = []
        for name, url, headers in pages(idle_run.pk, drain.pk):
            before = deleted_so_far(drain)
            t = time.perf_counter()
            r = timed_gets(client, url, n, **headers)
            r["deleted"] = deleted_so_far(drain) - before
            r["rate"] = r["deleted"] / (time.perf_counter() - t)
            results.append((name, r))
        before = deleted_so_far(drain)
        t = time.perf_counter()
        r = timed_gets(client, "/metrics", min(n, 10))
        r["deleted"] = deleted_so_far(drain) - before
        r["rate"] = r["deleted"] / (time.perf_counter() - t)
        results.append(("/metrics", r))
        state = Run.objects.get(pk=drain.pk).state
        # why the workers paused, if they did: the guard's reasons left on the run's chunks
        from django.db.models import Count

        from runs.models import Chunk
        from runs.progress import progress_for

        throttles = list(
            Chunk.objects.filter(run=drain)
            .exclude(throttle_reason="")
            .values_list("throttle_reason")
            .annotate(n=Count("id"))
            .order_by("-n")[:5]
        )
        drained = progress_for([drain.pk], now=timezone.now())[drain.pk]
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    print()
    print(
        f"{'page, while two workers drain':36} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} "
        f"{'rows deleted meanwhile':>23} {'rows/s':>9}   target p95 <= 150 ms"
    )
    for name, r in results:
        print(
            f"{name:36} {r['p50']:9.1f} {r['p95']:9.1f} {r['max']:9.1f} {r['deleted']:23,} "
            f"{r['rate']:9,.0f}"
        )
    print(
        f"» the draining run is {state} after the measurements: {drained.rows_deleted:,} of "
        f"{drained.expected_bound} {drained.rows_expected:,} rows deleted"
    )
    for reason, n in throttles:
        print(f"  throttled {n:,} time(s) (chunks left with this reason): {reason[:150]}")


FLEET_PAGES = (
    ("overview (full page)", "/", {}),
    ("overview (HTMX fragment)", "/", {"HTTP_HX_REQUEST": "true"}),
    ("overview ?policy=fleet", "/?policy=fleet", {}),
    ("policy page", "/policies/fleet/", {}),
    ("the policy's targets (its fragment)", "/runs/fleet/fleet/", {"HTTP_HX_REQUEST": "true"}),
    ("targets page", "/runs/targets/", {}),
    ("a draining target's page", "/runs/targets/t0/", {}),
)


def _silent_server():
    """A TCP port that accepts connections and never answers: a server that does not answer
    (hung, or behind a path that drops its replies). Returns (port, closer)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # kept open, never read, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()

    return listener.getsockname()[1], close, held


def _settled(client: Client, within_s: float = 60.0) -> None:
    """Until no page of the fleet says "reading…": the pages never wait for a ledger, they
    show each target's last reading (runs.fleet.view), taken in the background."""
    deadline = time.monotonic() + within_s
    for _name, path, headers in FLEET_PAGES:
        while "data-reading" in client.get(path, **headers).content.decode():
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


def ledger_read_times(names: list[str], n: int) -> dict:
    """One target's ledger read as the background readers read it (each policy's latest run
    and its progress), on each of ``names`` in turn: no page waits for these."""
    from retention.models import Policy
    from runs.fleet import view as fleet_view
    from targets import connections as C

    ids = list(Policy.objects.filter(slug="fleet").values_list("id", flat=True))
    times = []
    for _ in range(max(1, n // len(names))):
        for name in names:
            with C.on(name):
                start = time.perf_counter()
                fleet_view.READS[fleet_view.LATEST](ids)
                times.append((time.perf_counter() - start) * 1000)
    C.close_all()
    times.sort()
    return {
        "p50": statistics.median(times),
        "p95": times[max(0, round(0.95 * len(times)) - 1)],
        "max": times[-1],
    }


def fleet_read_times(n: int) -> dict:
    """The fleet's share of the overview: ``runs.fleet.view.fleet_of`` alone (the registry,
    every target's last reading, the convergence; a read started in the background when a
    reading is older than ``FRESH_S``), as the overview calls it."""
    from retention.models import Policy
    from runs.fleet import view as fleet_view
    from targets import connections as C

    policies = list(Policy.objects.filter(slug="fleet"))
    targets = {p.id: C.resolve(p.approved_version.parsed.targets) for p in policies}
    fleet_view.fleet_of(policies, targets)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fleet_view.fleet_of(policies, targets)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {
        "p50": statistics.median(times),
        "p95": times[max(0, round(0.95 * len(times)) - 1)],
        "max": times[-1],
    }


def measure_fleet(n_targets: int, rows: int, n: int, pace: int, explain_pages: bool) -> None:
    """The fleet's pages with ``n_targets`` targets, two of them draining, then with a target
    that does not answer (module docstring)."""
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from retention import actions
    from retention.spec import PolicySpec
    from runs.models import AuditRecord, Run
    from targets import connections as C
    from targets.models import Target
    from tests.fleet import servers
    from tests.fleet.conftest import migrate_url

    def cli(*args: str) -> str:
        from io import StringIO

        out = StringIO()
        call_command("retention", *args, stdout=out, stderr=StringIO())
        return out.getvalue()

    compliance = Group.objects.get_or_create(name="compliance")[0]
    oncall = Group.objects.get_or_create(name="oncall")[0]
    author = User.objects.create_user("bench-author", password="x")
    approver = User.objects.create_user("bench-approver", password="x")
    operator = User.objects.create_user("bench-oncall", password="x")
    for user, group in ((author, compliance), (approver, compliance), (operator, oncall)):
        user.groups.add(group)
    admin = User.objects.create_superuser("bench-admin", password="x")
    from core.tokens import create_token

    os.environ["RETENTION_TOKEN"] = create_token(operator, name="bench")[1]

    t0 = time.perf_counter()
    server = servers.embedded("bench")
    template = server.ledger_template(migrate_url)
    made = []
    draining = ("t0", "t1")
    for i in range(n_targets):
        name = f"t{i}"
        database = server.create_database(template=template)
        made.append(database)
        os.environ[f"BENCH_PAGES_{i}"] = server.admin_url(database)
        Target.objects.create(name=name, dsn_env=f"BENCH_PAGES_{i}", group="fleet")
        with C.on(name), connection.cursor() as cur:
            cur.execute(
                """CREATE TABLE public.bench_drain (id bigint PRIMARY KEY, tenant_id int NOT NULL,
                   occurred_at timestamptz NOT NULL, status text)"""
            )
            size = rows if name in draining else 20_000
            cur.execute(
                """INSERT INTO public.bench_drain SELECT g, g %% 13,
                   now() - make_interval(days => 40) + make_interval(secs => g * (11.0 * 86400 / %s)),
                   CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed' END
                   FROM generate_series(1, %s) g""",
                [size, size],
            )
            cur.execute("CREATE INDEX ON public.bench_drain (occurred_at)")
            cur.execute("VACUUM (ANALYZE) public.bench_drain")
    C.close_all()
    spec = PolicySpec.parse(
        dict(
            slug="fleet", name="Fleet bench", table="public.bench_drain", key="id",
            timestamp="occurred_at", tenant="tenant_id", retention="30 days",
            schedule="0 3 * * *", timezone="UTC", chunk_size=2000, chunking="key",
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
            limits={"policy_workers": 2}, targets=["group:fleet"], pace_rows_per_s=pace,
        )
    )  # fmt: skip
    version = actions.apply_spec(spec, author=author)
    version = actions.submit_version(version, actor=author, reason="bench")
    actions.approve_version(version, actor=approver, reason="bench")
    keys = cli("trigger", "fleet", "--period", time.strftime("%Y-%m-%d")).split()
    for key in keys:
        if key.split(":")[0] not in draining:
            cli("drain", key, "--until-idle")
    print(
        f"» {n_targets} targets ({', '.join(draining)}: {rows:,} rows each, the others 20,000,"
        f" drained), {len(keys)} runs, in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    from bench.common import server_url, with_database

    url = with_database(server_url(), connection.settings_dict["NAME"])
    env = dict(os.environ, DATABASE_URL=url, RETENTION_DEMO="1", LOG_LEVEL="WARNING")
    env["RETENTION_GUARD"] = "0"  # the drains go on whatever the busy machine does to a probe
    env.pop("TEST_DATABASE_NAME", None)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "retention",
                "drain",
                key,
                "--budget",
                "600",
                "--workers",
                "1",
                "--until-idle",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for key in keys
        if key.split(":")[0] in draining
    ]

    def deleted() -> int:
        total = 0
        for name in draining:
            with C.on(name):
                total += sum(AuditRecord.objects.values_list("rows_deleted", flat=True))
        return total

    client = Client()
    client.force_login(admin)
    from runs.fleet import view as fleet_view

    try:
        deadline = time.monotonic() + 180
        while deleted() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        _settled(client)
        results = []
        load_before = os.getloadavg()[0]
        for name, path, headers in FLEET_PAGES:
            before, t = deleted(), time.perf_counter()
            r = timed_gets(client, path, n, **headers)
            r["deleted"] = deleted() - before
            r["rate"] = r["deleted"] / (time.perf_counter() - t)
            results.append((name, r))
        load_1 = os.getloadavg()[0]
        reads = fleet_read_times(n)
        ledger = ledger_read_times([f"t{i}" for i in range(n_targets)], n)
        if explain_pages:
            explain(client, "/")
            profile(client, "/", n)

        # a target of the group whose server does not answer
        port, close_silent, attempts = _silent_server()
        os.environ["BENCH_PAGES_SILENT"] = f"postgresql://postgres@127.0.0.1:{port}/ledger"
        Target.objects.create(name="silent", dsn_env="BENCH_PAGES_SILENT", group="fleet")
        first = []
        for round_ in ("first", "after"):
            if round_ == "after":  # its read has now waited longer than a reading may take
                time.sleep(fleet_view.SILENT_S + 0.2)
            for name, path, headers in FLEET_PAGES:
                t = time.perf_counter()
                response = client.get(path, **headers)
                ms = (time.perf_counter() - t) * 1000
                body = response.content.decode()
                silent_tile = body[body.find('data-target="silent"') :][:600]
                said = (
                    "does not answer"
                    if "does not answer" in silent_tile
                    else "reading…"
                    if "reading" in silent_tile
                    else "unreachable"
                    if "unreachable" in silent_tile
                    else "—"
                    if 'data-target="silent"' not in body
                    else "?"
                )
                first.append((round_, name, ms, response.status_code, said))
        attempts_then = len(attempts)
        with_silent = []
        for name, path, headers in FLEET_PAGES:
            before, t = deleted(), time.perf_counter()
            r = timed_gets(client, path, n, **headers)
            r["deleted"] = deleted() - before
            r["rate"] = r["deleted"] / (time.perf_counter() - t)
            with_silent.append((name, r))
        attempts_after = len(attempts)
        silent = Target.objects.get(name="silent")
        close_silent()
        states = {}
        for name in draining:
            with C.on(name):
                states[name] = Run.objects.get().state
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
        C.close_all()
        for database in made:
            server.drop_database(database)

    def table(title: str, rows) -> None:
        print(
            f"{title:40} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} {'CPU p50':>8} {'CPU p95':>8} "
            f"{'queries':>8} {'rows deleted meanwhile':>23} {'rows/s':>9}"
        )
        for name, r in rows:
            print(
                f"{name:40} {r['p50']:9.1f} {r['p95']:9.1f} {r['max']:9.1f} {r['cpu_p50']:8.1f} "
                f"{r['cpu_p95']:8.1f} {r['queries']:8} {r['deleted']:23,} {r['rate']:9,.0f}"
            )

    print()
    table(f"fleet page, {n_targets} targets, 2 draining", results)
    print(
        f"{'of which the fleet (fleet_of alone)':40} {reads['p50']:9.1f} {reads['p95']:9.1f} "
        f"{reads['max']:9.1f}"
    )
    print(
        f"{'one ledger read (background, no page)':40} {ledger['p50']:9.1f} "
        f"{ledger['p95']:9.1f} {ledger['max']:9.1f}"
    )
    print(
        "» ms: wall clock in the web process (Django's test client: no network, no server queue);"
        " CPU: the request thread's own CPU time"
    )
    print(f"» load average (1 min) before these: {load_before:.2f}, after: {load_1:.2f}")
    print()
    print(
        "a target that does not answer joins the group: each page's first request, and again "
        f"{fleet_view.SILENT_S + 0.2:.1f} s later; what the page says of it"
    )
    print(f"{'page':40} {'round':>6} {'ms':>9} {'status':>7}  says")
    for round_, name, ms, status, said in first:
        print(f"{name:40} {round_:>6} {ms:9.1f} {status:7}  {said}")
    print(
        f"» connection attempts to it: {attempts_then} after those requests, {attempts_after} "
        f"after {len(FLEET_PAGES) * (n + 2)} more; the registry notes it: unreachable since "
        f"{silent.unreachable_since}, {silent.unreachable_reason!r}"
    )
    print()
    table("with it in place", with_silent)
    print(f"» the draining runs after the measurements: {states}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--audit", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument(
        "--explain", action="store_true", help="EXPLAIN (ANALYZE, BUFFERS) the run page's queries"
    )
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="VACUUM the ledger after building (as autovacuum would)",
    )
    parser.add_argument("--drain-rows", type=int, default=20_000_000)
    parser.add_argument("--no-drain", action="store_true", help="measure idle runs only")
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        help="measure the fleet's pages with this many targets, two of them draining",
    )
    parser.add_argument(
        "--fleet-rows", type=int, default=1_000_000, help="rows of each draining target"
    )
    parser.add_argument(
        "--fleet-pace",
        type=int,
        default=3000,
        help="the fleet policy's pace_rows_per_s, so that the two drains last every page",
    )
    parser.add_argument(
        "--drain-pace",
        type=int,
        default=0,
        help="the draining policy's pace_rows_per_s (0: none), so the drain lasts every page",
    )
    args = parser.parse_args()

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    print("» creating the throwaway database bench_dashboard", flush=True)
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    if args.fleet:
        try:
            measure_fleet(args.fleet, args.fleet_rows, args.requests, args.fleet_pace, args.explain)
        finally:
            if not args.keep:
                connection.creation.destroy_test_db(old_name, verbosity=0)
        return
    try:
        t0 = time.perf_counter()
        world = build(args.chunks, args.audit, args.vacuum)
        print(
            f"» built {world['all_chunks']:,} chunks ({world['current_chunks']:,} in the active run) "
            f"and {world['audit_rows']:,} audit rows in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        client = Client()
        client.force_login(world["admin"])
        run = world["current"]
        n = args.requests
        results = [
            (name, timed_gets(client, url, n, **headers)) for name, url, headers in pages(run.pk)
        ]
        results.append(("/metrics", timed_gets(client, "/metrics", min(n, 10))))
        if args.explain:
            explain(client, f"/runs/{run.pk}/")
            explain(client, "/metrics")
        print()
        print(f"{'page':32} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}   target p95 <= 150 ms")
        for name, r in results:
            print(f"{name:32} {r['p50']:9.1f} {r['p95']:9.1f} {r['max']:9.1f}")
        exports = [
            (
                f"CSV, active run ({run.pk})",
                stream(client, f"/runs/audit/export.csv?run={run.pk}"),
            ),
            ("CSV, whole trail", stream(client, "/runs/audit/export.csv")),
            ("manifest JSON, active run", stream(client, f"/runs/{run.pk}/manifest.json")),
        ]
        print()
        print(
            f"{'export':30} {'lines':>10} {'seconds':>8} {'rows/s':>10} {'/web CPU s':>10} {'MB':>7} "
            f"{'RSS start':>10} {'@100k':>8} {'RSS peak':>9}   target >= 100k rows/s, flat RSS"
        )
        for name, r in exports:
            at_100k = f"{r['rss_at_100k']:.1f}M" if r["rss_at_100k"] else "-"
            print(
                f"{name:30} {r['rows']:10,} {r['seconds']:8.2f} {r['rows_per_s']:10,.0f} "
                f"{r['rows_per_cpu_s']:10,.0f} "
                f"{r['mb']:7.1f} {r['rss_start']:9.1f}M "
                f"{at_100k:>8} {r['rss_peak']:8.1f}M"
            )
        if not args.no_drain:
            measure_draining(client, run, args.drain_rows, n, args.drain_pace)
    finally:
        if args.keep:
            print("» kept database bench_dashboard")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    print(f"» load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    main()
    print(f"» load average after: {os.getloadavg()[0]:.2f}")
