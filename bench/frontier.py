"""The guard's controller judged against the frontier of its limit.

``python -m bench.frontier [--rows 3000000] [--seconds 30] [--limits tight,default,loose]``

On the bench database (bench/common.py), one template table (bench/guard_controller.py's
layout: bigint key in time order, 50 tenants, 45% past the 55-day retention) and, for every
contender, a fresh copy of it with the bench's foreground load beside it (bench/load.py, 200
ops/s open loop, the foreground's own latencies):

1. **Idle**: the load alone for ``--idle`` seconds: the foreground's idle p99, which the
   relative limits are stated against.
2. **Static sweep**: the product with its knobs held (``RETENTION_GUARD_STATIC`` =
   concurrency, chunk target ms, duty cycle; two worker processes, no pace), each setting for
   ``--seconds``: rows/s, the foreground's p99 and max. For each limit the **frontier** is the
   fastest static setting whose foreground p99 held the limit.
3. **The controller**, from a cold start (a new policy: its first step is at the floor), with
   the product's defaults and the limit stated in the policy (``[guard]``), for ``--seconds``
   with a foreground step up in the middle third (a reporting session of aggregates over the
   table joins the load) and a step down after it: its rate ÷ the frontier's, its p99 and max
   against the limit, and per phase.

Limits: ``tight`` (relative: max(1.5 × idle, idle + 1 ms), the previous default), ``default``
(the product's: max(2 × idle, idle + 5 ms)) and ``loose`` (absolute: 25 ms).

Prints Markdown tables; saves ``bench/results/frontier-<rows>.json|.md`` and draws
``docs/img/guard-frontier.svg`` (rate against foreground p99 for the static sweep, the
controller's point for each limit, the limits as vertical lines).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench import guard_controller as gc
from bench.common import ROOT, SCHEMA, percentile, server_url, with_database
from bench.guard_controller import PRODUCT_SCHEMA, ReportingJob, child_env

DB = "retention_bench_frontier"
STAMP = format(int(time.time()), "x")[-6:]
TEMPLATE = "frontier_tpl"
RESULTS = ROOT / "bench" / "results"
SVG = ROOT / "docs" / "img" / "guard-frontier.svg"
LIMITS = {
    "tight": {"inflation": 1.5, "margin_ms": 1.0},
    "default": {"inflation": 2.0, "margin_ms": 5.0},
    "loose": {"fg_p99_ms": 25.0},
}
RATE = {"ops": 200}  # the foreground's operations per second (--rate)
SWEEP = [(c, ms, duty) for c in (1, 2) for ms in (50, 300) for duty in (25, 100)]


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def limit_ms(limit: dict, idle_p99: float) -> float:
    if "fg_p99_ms" in limit:
        return float(limit["fg_p99_ms"])
    return max(limit["inflation"] * idle_p99, idle_p99 + limit["margin_ms"])


def connect(url: str) -> psycopg.Connection:
    return psycopg.connect(
        url,
        autocommit=True,
        application_name="bench-frontier",
        options=f"-c search_path={PRODUCT_SCHEMA},public",
    )


def prepare(server: str, url: str, rows: int, tick: datetime) -> psycopg.Connection:
    with psycopg.connect(server, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            admin.execute(f'CREATE DATABASE "{DB}"')
    for cmd in (["migrate", "--no-input", "-v", "0"], ["createcachetable"]):
        subprocess.run(
            [sys.executable, "manage.py", *cmd], cwd=ROOT, env=child_env(url), check=True
        )
    conn = connect(url)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for (old,) in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'frontier_%%'",
        [SCHEMA],
    ).fetchall():
        conn.execute(f"DROP TABLE {SCHEMA}.{old}")
    conn.execute(
        f"CREATE TABLE {SCHEMA}.{TEMPLATE} (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " occurred_at timestamptz NOT NULL, kind text NOT NULL, payload text)"
        " WITH (autovacuum_enabled = off)"
    )
    log(f"generating {rows:,} rows")
    conn.execute(
        f"INSERT INTO {SCHEMA}.{TEMPLATE} SELECT g, 1 + g %% 50,"
        " %s::timestamptz - make_interval(secs => 100 * 86400.0 * (1 - g::float8 / %s)),"
        " 'page.viewed', repeat('x', 90) FROM generate_series(1, %s) g",
        [tick, rows, rows],
    )
    return conn


def fresh_copy(conn: psycopg.Connection, name: str) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{name}")
    conn.execute(
        f"CREATE TABLE {SCHEMA}.{name} (LIKE {SCHEMA}.{TEMPLATE} INCLUDING ALL)"
        " WITH (autovacuum_enabled = off)"
    )
    conn.execute(f"INSERT INTO {SCHEMA}.{name} SELECT * FROM {SCHEMA}.{TEMPLATE}")
    conn.execute(f"CREATE INDEX ON {SCHEMA}.{name} (tenant_id, id)")
    conn.execute(f"CREATE INDEX ON {SCHEMA}.{name} (occurred_at)")
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.{name}")
    conn.execute("CHECKPOINT")


def setup_in_django(spec: dict) -> dict:
    """In a child process: a new policy approved through the real actions and its run
    triggered for the dataset's tick (as bench/guard_controller.py does), with ``[guard]``."""
    from bench import product

    product._django()
    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec
    from runs.actions import trigger_run

    fields = {
        "slug": spec["slug"],
        "table": f"{SCHEMA}.{spec['table']}",
        "key": "id",
        "timestamp": "occurred_at",
        "retention": "55 days",
        "schedule": "0 0 * * *",
        "timezone": "UTC",
        "chunk_size": 5000,
        "target_chunk_ms": spec["target_chunk_ms"],
        "blast_radius": 1000.0,
        "limits": {"policy_workers": 2, "tenant_workers": 2},
        "guard": spec["guard"],
    }
    author, approver = product._user("bench-author"), product._user("bench-approver")
    version = actions.apply_spec(PolicySpec.parse(fields), author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    if version.state == PolicyVersion.State.SUBMITTED:
        actions.approve_version(version, actor=approver, reason="benchmark")
    policy = Policy.objects.get(slug=spec["slug"])
    run, _ = trigger_run(policy, tick=datetime.fromisoformat(spec["tick"]))
    return {"run_key": run.run_key, "expected_rows": run.expected_rows}


def start_load(url: str, table: str, tick: datetime) -> subprocess.Popen:
    load = subprocess.Popen(
        [sys.executable, "-m", "bench.load", json.dumps({
            "dsn": url, "table": table, "cutoff": (tick - timedelta(days=55)).isoformat(),
            "rate": RATE["ops"], "pk": ["id"], "key_kind": "bigint", "tenant_order": "id",
        })],
        cwd=ROOT, env=child_env(url), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert load.stdout.readline().strip() == "ready"
    load.stdin.write("go\n")
    load.stdin.flush()
    return load


def stop_load(load: subprocess.Popen) -> dict:
    out, _ = load.communicate("stop\n", timeout=300)
    return json.loads(out.strip().splitlines()[-1])


def fg_stats(fg: dict, since: float, until: float) -> dict:
    """The foreground's p99 and max over the epoch seconds [since, until)."""
    lat = [ms for at, ms, _k in fg["ops"] if since <= fg["t0"] + at < until]
    if not lat:
        return {"n": 0, "p99_ms": None, "max_ms": None}
    return {
        "n": len(lat),
        "p99_ms": round(percentile(lat, 99), 2),
        "max_ms": round(max(lat), 2),
    }


def contender(
    conn, url: str, tick: datetime, name: str, guard: dict, env: dict, seconds: float, steps: bool
) -> dict:
    """One run on a fresh copy beside the foreground for ``seconds``: rows/s from the audit
    ledger, the foreground's p99 and max (whole, and per third with ``steps``)."""
    table = f"frontier_{STAMP}_{name}"
    slug = f"frontier-{STAMP}-{name}".replace("_", "-")
    fresh_copy(conn, table)
    spec = {
        "slug": slug,
        "table": table,
        "target_chunk_ms": 300,
        "guard": {"probe_p95_ms": 5000.0, **guard},
        "tick": tick.isoformat(),
    }
    out = subprocess.run(
        [sys.executable, "-m", "bench.frontier", "--setup", json.dumps(spec)],
        cwd=ROOT, env=child_env(url), capture_output=True, text=True, check=True,
    )  # fmt: skip
    run = json.loads(out.stdout.strip().splitlines()[-1])
    load = start_load(url, table, tick)
    time.sleep(2.0)  # the load settles before cleanup starts
    t0 = time.time()
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    logs = [open(RESULTS / "logs" / f"frontier-{name}-{n}.log", "w") for n in range(2)]  # noqa: SIM115
    workers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "retention", "drain", run["run_key"], "--until-idle"],
            cwd=ROOT,
            env=child_env(url, LOG_LEVEL="WARNING", **env),
            stdout=logs[n],
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for n in range(2)
    ]
    job = ReportingJob(url, sessions=1) if steps else None
    job_table = None
    try:
        # the window opens at the run's first chunk (the workers' start-up is not timed)
        deadline = time.time() + 180
        while time.time() < deadline:
            (started,) = conn.execute(
                "SELECT extract(epoch FROM min(started_at)) FROM runs_auditrecord"
                " WHERE policy_slug = %s",
                [slug],
            ).fetchone()
            if started is not None:
                t0 = float(started)
                break
            time.sleep(0.2)
        else:
            t0 = time.time()
            log(f"{name}: no chunk within 180 s of the workers' start")
        time.sleep(max(0.0, t0 - time.time()))
        if steps:
            # the reporting job reads the table its module names
            job_table, gc.TABLE = gc.TABLE, table
            time.sleep(seconds / 3)
            job.start()
            time.sleep(seconds / 3)
            job.end()
            time.sleep(seconds / 3)
        else:
            time.sleep(seconds)
    finally:
        if job is not None and steps and job.threads[0].is_alive():
            job.end()
        if job_table is not None:
            gc.TABLE = job_table
        for w in workers:
            w.kill()
            w.wait()
        for f in logs:
            f.close()
        fg = stop_load(load)
    t1 = t0 + seconds
    deleted, first, last = conn.execute(
        "SELECT coalesce(sum(rows_deleted), 0), extract(epoch FROM min(started_at))::float8,"
        " extract(epoch FROM max(committed_at))::float8 FROM runs_auditrecord WHERE policy_slug = %s",
        [slug],
    ).fetchone()
    drained = conn.execute(
        "SELECT state FROM runs_run WHERE run_key = %s", [run["run_key"]]
    ).fetchone()[0]
    # a run that drained before the time was up is measured to its last commit
    busy_s = (float(last) - t0) if drained == "drained" and last else seconds
    result = {
        "name": name,
        "rows_deleted": int(deleted),
        "seconds": round(busy_s, 2),
        "rows_per_s": round(int(deleted) / max(0.001, busy_s), 1),
        "run_state": drained,
        "fg": fg_stats(fg, t0, min(t1, t0 + busy_s)),
    }
    if steps:
        third = seconds / 3
        result["phases"] = {}
        for i, phase in enumerate(("before", "step up", "step down")):
            a, b = t0 + i * third, t0 + (i + 1) * third
            rows = conn.execute(
                "SELECT coalesce(sum(rows_deleted), 0) FROM runs_auditrecord WHERE"
                " policy_slug = %s AND committed_at >= to_timestamp(%s)"
                " AND committed_at < to_timestamp(%s)",
                [slug, a, b],
            ).fetchone()[0]
            result["phases"][phase] = {
                "rows_per_s": round(int(rows) / third, 1),
                "fg": fg_stats(fg, a, b),
            }
        result["steps"] = [
            {"t": round(at - t0, 2), "action": action, "concurrency": c, "chunk_ms": ms,
             "duty_cycle": duty, "p99_ms": p99, "limit_ms": lim}
            for at, action, c, ms, duty, p99, lim in conn.execute(
                "SELECT extract(epoch FROM s.taken_at)::float8, s.action, s.concurrency, s.chunk_ms,"
                " s.duty_cycle, s.probe_p99_ms, s.limit_ms FROM runs_guardcontrolstep s"
                " JOIN retention_policy p ON p.id = s.policy_id WHERE p.slug = %s ORDER BY s.id",
                [slug],
            )
        ]  # fmt: skip
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}")
    log(
        f"{name}: {result['rows_per_s']:,.0f} rows/s, fg p99 {result['fg']['p99_ms']} ms,"
        f" max {result['fg']['max_ms']} ms"
    )
    return result


def idle(conn, url: str, tick: datetime, seconds: float) -> dict:
    table = f"frontier_{STAMP}_idle"
    fresh_copy(conn, table)
    load = start_load(url, table, tick)
    time.sleep(2.0)
    t0 = time.time()
    time.sleep(seconds)
    fg = stop_load(load)
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}")
    return fg_stats(fg, t0, t0 + seconds)


def report(result: dict) -> str:
    idle_p99 = result["idle"]["p99_ms"]
    lines = [
        f"{result['rows']:,} rows, {result['seconds']:g} s per contender, foreground"
        f" {result.get('rate', 200)} ops/s;"
        f" idle p99 {idle_p99} ms (max {result['idle']['max_ms']} ms); {result['when']},"
        f" commit {result['commit']}\n",
        "Static sweep (two workers, no pace; knobs held by `RETENTION_GUARD_STATIC`):\n",
        "| at once | chunk ms | duty | rows/s | fg p99 ms | fg max ms |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for s in result["static"]:
        c, ms, duty = s["setting"]
        lines.append(
            f"| {c} | {ms} | {duty:.0%} | {s['rows_per_s']:,.0f} | {s['fg']['p99_ms']} |"
            f" {s['fg']['max_ms']} |"
        )
    lines += [
        "\nThe controller from a cold start against the frontier of each limit (step up: a"
        " reporting session joins the foreground in the middle third):\n",
        "| limit | limit ms | frontier setting | frontier rows/s | controller rows/s | ratio |"
        " controller p99 ms | max ms | held | before / step up / step down rows/s |"
        " p99 ms per phase |",
        "|---|--:|---|--:|--:|--:|--:|--:|---|---|---|",
    ]
    for name, c in result["controller"].items():
        lim = c["limit_ms"]
        front = c["frontier"]
        fs = (
            f"{front['setting'][0]} × {front['setting'][1]} ms × {front['setting'][2]:.0%}"
            if front
            else "none holds"
        )
        fr = front["rows_per_s"] if front else None
        ratio = f"{c['rows_per_s'] / fr:.2f}" if fr else "—"
        phases = c.get("phases") or {}
        lines.append(
            f"| {name} | {lim:.2f} | {fs} | {fr if fr is not None else '—'} |"
            f" {c['rows_per_s']:,.0f} | {ratio} | {c['fg']['p99_ms']} | {c['fg']['max_ms']} |"
            f" {'yes' if (c['fg']['p99_ms'] or 0) <= lim else 'no'} |"
            f" {' / '.join(str(p['rows_per_s']) for p in phases.values())} |"
            f" {' / '.join(str(p['fg']['p99_ms']) for p in phases.values())} |"
        )
    return "\n".join(lines) + "\n"


def draw(result: dict) -> None:
    """Rate against foreground p99: the static sweep's points, each limit as a vertical line
    and the controller's point for each limit."""
    pts = [(s["fg"]["p99_ms"] or 0, s["rows_per_s"], s["setting"]) for s in result["static"]]
    ctl = [(n, c["fg"]["p99_ms"] or 0, c["rows_per_s"], c["limit_ms"]) for n, c in
           result["controller"].items()]  # fmt: skip
    xmax = max([p[0] for p in pts] + [c[1] for c in ctl] + [c[3] for c in ctl] + [1.0]) * 1.1
    ymax = max([p[1] for p in pts] + [c[2] for c in ctl] + [1.0]) * 1.1
    w, h, left, bottom, top, right = 760, 460, 80, 60, 50, 30
    x = lambda v: left + (w - left - right) * v / xmax  # noqa: E731
    y = lambda v: h - bottom - (h - bottom - top) * v / ymax  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="24" font-size="14" font-weight="bold">Rate against the'
        f" foreground's p99: static settings and the controller ({result['rows']:,} rows)</text>",
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}"'
        ' fill="none" stroke="#999"/>',
    ]
    colors = {"tight": "#c0392b", "default": "#2c3e50", "loose": "#27ae60"}
    for name, _p99, _rate, lim in ctl:
        color = colors.get(name, "#555")
        parts.append(
            f'<line x1="{x(lim):.1f}" y1="{top}" x2="{x(lim):.1f}" y2="{h - bottom}"'
            f' stroke="{color}" stroke-dasharray="5,3"/><text x="{x(lim) + 3:.1f}"'
            f' y="{top + 14}" fill="{color}">limit {name} {lim:.1f} ms</text>'
        )
    for p99, rate, (c, ms, duty) in pts:
        parts.append(
            f'<circle cx="{x(p99):.1f}" cy="{y(rate):.1f}" r="4" fill="#7f8c8d"/>'
            f'<text x="{x(p99) + 6:.1f}" y="{y(rate) + 4:.1f}" fill="#555" font-size="10">'
            f"{c}×{ms}ms×{duty:.0%}</text>"
        )
    for name, p99, rate, _lim in ctl:
        color = colors.get(name, "#555")
        parts.append(
            f'<rect x="{x(p99) - 5:.1f}" y="{y(rate) - 5:.1f}" width="10" height="10"'
            f' fill="{color}"/><text x="{x(p99) + 8:.1f}" y="{y(rate) - 6:.1f}"'
            f' fill="{color}">controller ({name})</text>'
        )
    for k in range(6):
        vx, vy = xmax * k / 5, ymax * k / 5
        parts.append(
            f'<text x="{x(vx):.1f}" y="{h - bottom + 16}" text-anchor="middle">{vx:.0f}</text>'
            f'<text x="{left - 6}" y="{y(vy) + 4:.1f}" text-anchor="end">{vy:,.0f}</text>'
        )
    parts.append(
        f'<text x="{(w + left) / 2:.0f}" y="{h - 18}" text-anchor="middle">foreground p99 (ms)'
        f'</text><text x="16" y="{(h + top) / 2:.0f}" transform="rotate(-90 16'
        f' {(h + top) / 2:.0f})" text-anchor="middle">rows deleted per second</text>'
    )
    parts.append("</svg>")
    SVG.parent.mkdir(parents=True, exist_ok=True)
    SVG.write_text("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--limits", default="tight,default,loose")
    parser.add_argument("--rate", type=int, default=200, help="foreground operations per second")
    parser.add_argument("--setup", help=argparse.SUPPRESS)  # the child process of contender
    args = parser.parse_args()
    if args.setup:
        print(json.dumps(setup_in_django(json.loads(args.setup))))
        return
    RATE["ops"] = args.rate
    server = server_url()
    url = with_database(server, DB)
    now = datetime.now(UTC)
    tick = now.replace(hour=0, minute=0, second=0, microsecond=0)
    conn = prepare(server, url, args.rows, tick)
    idle_fg = idle(conn, url, tick, args.idle)
    log(f"idle: p99 {idle_fg['p99_ms']} ms, max {idle_fg['max_ms']} ms")
    static = []
    for c, ms, duty in SWEEP:
        env = {
            "RETENTION_GUARD_STATIC": f"{c},{ms},{duty}",
            "RETENTION_GUARD_DUTY_CYCLE_PCT": "100",
        }
        r = contender(conn, url, tick, f"s{c}_{ms}_{duty}", {}, env, args.seconds, False)
        r["setting"] = [c, ms, duty / 100]
        static.append(r)
    controller = {}
    for name in args.limits.split(","):
        lim = limit_ms(LIMITS[name], idle_fg["p99_ms"])
        held = [s for s in static if s["fg"]["p99_ms"] is not None and s["fg"]["p99_ms"] <= lim]
        front = max(held, key=lambda s: s["rows_per_s"]) if held else None
        r = contender(conn, url, tick, f"c_{name}", LIMITS[name], {}, args.seconds, True)
        r["limit"] = LIMITS[name]
        r["limit_ms"] = round(lim, 3)
        r["frontier"] = (
            {"setting": front["setting"], "rows_per_s": front["rows_per_s"]} if front else None
        )
        controller[name] = r
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    result = {
        "rows": args.rows,
        "seconds": args.seconds,
        "rate": args.rate,
        "idle": idle_fg,
        "static": static,
        "controller": controller,
        "when": now.isoformat(timespec="seconds"),
        "commit": commit,
        "load_average": os.getloadavg(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / f"frontier-{args.rows}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=1))
    text = report(result)
    base.with_suffix(".md").write_text(text)
    draw(result)
    print(text)


if __name__ == "__main__":
    main()
