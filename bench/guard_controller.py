"""The guard's latency controller in a real run, drawn from its own recorded steps.

``python -m bench.guard_controller [--rows 3000000] [--quiet 20] [--pressure 30] [--after 30]``

On the bench database (bench/common.py: its own database on the embedded server), one table of
``--rows`` rows (45% past the retention) with the bench's foreground load on it (bench/load.py,
200 ops/s open loop, whose latencies are the foreground's own), and a run of a policy with two
workers (``retention drain RUN_KEY --until-idle`` in two processes, the product's defaults except
a controller period of 2 s) and ``pace_rows_per_s`` of ``--pace`` (so that the run outlasts the
phases on a small table). Three phases: ``--quiet`` seconds of cleanup beside the foreground alone, then
``--pressure`` seconds in which a reporting job joins (two sessions running aggregates over the
table: CPU contention on a small machine), then ``--after`` seconds without it.

Prints the controller's steps (from ``runs_guardcontrolstep``) and the foreground p99 per two
seconds, saves ``bench/results/guard-controller.json`` and draws ``docs/img/guard-controller.svg``
(knob settings and foreground p99 over time; docs/guard.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.common import ROOT, SCHEMA, percentile, server_url, with_database

DB = "retention_bench_guard"
STAMP = format(int(time.time()), "x")[-6:]
TABLE = f"guard_events_{STAMP}"  # a new table each time: an earlier run left open has its own
# a new policy each time (its controller starts from the floor, with no step of an earlier run)
SLUG = f"guard-controller-{STAMP}"
RESULTS = ROOT / "bench" / "results"
SVG = ROOT / "docs" / "img" / "guard-controller.svg"
WORKER_ENV = {"RETENTION_GUARD_CONTROL_PERIOD_MS": "2000", "LOG_LEVEL": "WARNING"}
BIN_S = 2.0
PRODUCT_SCHEMA = os.environ.get("RETENTION_SCHEMA", "retention_runner")  # its own tables


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def child_env(url: str, **extra) -> dict:
    env = dict(os.environ)
    env.update(DATABASE_URL=url, RETENTION_DEMO="1", DEBUG="0", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def prepare(server: str, url: str, rows: int, tick: datetime) -> psycopg.Connection:
    with psycopg.connect(server, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            admin.execute(f'CREATE DATABASE "{DB}"')
    for cmd in (["migrate", "--no-input", "-v", "0"], ["createcachetable"]):
        subprocess.run(
            [sys.executable, "manage.py", *cmd], cwd=ROOT, env=child_env(url), check=True
        )
    conn = psycopg.connect(
        url,
        autocommit=True,
        application_name="bench-guard",
        options=f"-c search_path={PRODUCT_SCHEMA},public",
    )
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for (old,) in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'guard_events_%%'",
        [SCHEMA],
    ).fetchall():
        conn.execute(f"DROP TABLE {SCHEMA}.{old}")
    conn.execute(
        f"CREATE TABLE {SCHEMA}.{TABLE} (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " occurred_at timestamptz NOT NULL, kind text NOT NULL, payload text)"
        " WITH (autovacuum_enabled = off)"
    )
    log(f"generating {rows:,} rows")
    # ids in time order over 100 days before the tick; the retention (55 days) makes 45% old
    conn.execute(
        f"INSERT INTO {SCHEMA}.{TABLE} SELECT g, 1 + g %% 50,"
        " %s::timestamptz - make_interval(secs => 100 * 86400.0 * (1 - g::float8 / %s)),"
        " 'page.viewed', repeat('x', 90) FROM generate_series(1, %s) g",
        [tick, rows, rows],
    )
    conn.execute(f"CREATE INDEX ON {SCHEMA}.{TABLE} (tenant_id, id)")
    conn.execute(f"CREATE INDEX ON {SCHEMA}.{TABLE} (occurred_at)")
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.{TABLE}")
    return conn


def setup_run(url: str, tick: datetime, pace: int) -> dict:
    spec = {
        "pace_rows_per_s": pace,
        "slug": SLUG,
        "table": TABLE,
        "retention": "55 days",
        "chunk_size": 5000,
        "target_chunk_ms": 300,
        "workers": 2,
        "tick": tick.isoformat(),
        "cutoff": (tick - timedelta(days=55)).isoformat(),
    }
    out = subprocess.run(
        [sys.executable, "-m", "bench.guard_controller", "--setup", json.dumps(spec)],
        cwd=ROOT,
        env=child_env(url),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def setup_in_django(spec: dict) -> dict:
    """In a child process: the policy approved through the real actions (an author and a
    second compliance user, as bench/product.py does) and its run triggered as the schedule
    would for the dataset's tick."""
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
        "retention": spec["retention"],
        "schedule": "0 0 * * *",
        "timezone": "UTC",
        "chunk_size": spec["chunk_size"],
        "target_chunk_ms": spec["target_chunk_ms"],
        "pace_rows_per_s": spec["pace_rows_per_s"],
        "blast_radius": 1000.0,
        "limits": {"policy_workers": spec["workers"], "tenant_workers": spec["workers"]},
    }
    author, approver = product._user("bench-author"), product._user("bench-approver")
    version = actions.apply_spec(PolicySpec.parse(fields), author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    if version.state == PolicyVersion.State.SUBMITTED:
        actions.approve_version(version, actor=approver, reason="benchmark")
    policy = Policy.objects.get(slug=spec["slug"])
    run, _ = trigger_run(policy, tick=datetime.fromisoformat(spec["tick"]))
    return {"run_key": run.run_key, "expected_rows": run.expected_rows, "state": run.state}


class ReportingJob:
    """Two sessions running aggregates over the table, one after another, until stopped."""

    def __init__(self, url: str, sessions: int = 2) -> None:
        self.url, self.stop = url, threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(sessions)]

    def _loop(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="bench-report") as c:
            while not self.stop.is_set():
                c.execute(
                    f"SELECT tenant_id, count(*), max(length(payload)) FROM {SCHEMA}.{TABLE}"
                    " GROUP BY tenant_id"
                ).fetchall()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--quiet", type=float, default=20.0)
    parser.add_argument("--pressure", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=30.0)
    parser.add_argument(
        "--pace", type=int, default=15_000, help="the policy's pace_rows_per_s (0: none)"
    )
    parser.add_argument("--redraw", action="store_true", help="draw the chart from the saved JSON")
    parser.add_argument("--setup", help=argparse.SUPPRESS)  # the child process of setup_run
    args = parser.parse_args()
    if args.setup:
        print(json.dumps(setup_in_django(json.loads(args.setup))))
        return
    out_json = RESULTS / "guard-controller.json"
    if args.redraw:
        result = json.loads(out_json.read_text())
        draw(result)
        report(result)
        return

    server = server_url()
    url = with_database(server, DB)
    now = datetime.now(UTC)
    tick = now.replace(hour=0, minute=0, second=0, microsecond=0)
    conn = prepare(server, url, args.rows, tick)
    run = setup_run(url, tick, args.pace)
    log(f"run {run['run_key']} ({run['expected_rows']:,} rows eligible)")
    policy_id = conn.execute("SELECT id FROM retention_policy WHERE slug = %s", [SLUG]).fetchone()[
        0
    ]

    load = subprocess.Popen(
        [sys.executable, "-m", "bench.load", json.dumps({
            "dsn": url, "table": TABLE, "cutoff": (tick - timedelta(days=55)).isoformat(),
            "rate": 200, "pk": ["id"], "key_kind": "bigint", "tenant_order": "id",
        })],
        cwd=ROOT, env=child_env(url), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert load.stdout.readline().strip() == "ready"
    load.stdin.write("go\n")
    load.stdin.flush()
    t0 = time.time()
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    logs = [open(RESULTS / "logs" / f"guard-worker-{n}.log", "w") for n in range(2)]  # noqa: SIM115
    workers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "retention", "drain", run["run_key"], "--until-idle"],
            cwd=ROOT,
            env=child_env(url, **WORKER_ENV),
            stdout=logs[n],
            stderr=subprocess.STDOUT,
        )
        for n in range(2)
    ]
    phases = {"pressure_from": args.quiet, "pressure_to": args.quiet + args.pressure}
    job = ReportingJob(url)
    try:
        time.sleep(args.quiet)
        log("reporting job starts")
        job.start()
        time.sleep(args.pressure)
        log("reporting job ends")
        job.end()
        time.sleep(args.after)
    finally:
        job.end()
        for w in workers:
            w.kill()
            w.wait()
        out, _ = load.communicate("stop\n", timeout=120)
    fg = json.loads(out.strip().splitlines()[-1])
    end = time.time() - t0
    steps = [
        {
            "t": round(taken.timestamp() - t0, 2),
            "action": action,
            "concurrency": c,
            "chunk_ms": ms,
            "duty_cycle": duty,
            "probe_p99_ms": p99,
            "idle_p99_ms": base,
            "inflation": infl,
            "budget": budget,
            "reason": reason,
        }
        for taken, action, c, ms, duty, p99, base, infl, budget, reason in conn.execute(
            "SELECT taken_at, action, concurrency, chunk_ms, duty_cycle, probe_p99_ms,"
            " baseline_ms, inflation, budget, reason FROM runs_guardcontrolstep"
            " WHERE policy_id = %s ORDER BY id",
            [policy_id],
        )
    ]
    deleted = conn.execute(
        "SELECT coalesce(sum(rows_deleted), 0) FROM runs_auditrecord WHERE policy_slug = %s", [SLUG]
    ).fetchone()[0]
    state = conn.execute(
        "SELECT state FROM runs_run WHERE run_key = %s", [run["run_key"]]
    ).fetchone()[0]
    offset = fg["t0"] - t0
    bins: dict[int, list[float]] = {}
    for at, latency, _kind in fg["ops"]:
        bins.setdefault(int((at + offset) // BIN_S), []).append(latency)
    foreground = [
        {"t": round((b + 0.5) * BIN_S, 1), "p99_ms": round(percentile(v, 99), 2), "n": len(v)}
        for b, v in sorted(bins.items())
        if b >= 0
    ]
    result = {
        "rows": args.rows,
        "pace_rows_per_s": args.pace,
        "ceilings": {"concurrency": 2, "chunk_ms": 300, "duty_cycle": 0.5},
        "run_key": run["run_key"],
        "run_state": state,
        "rows_deleted": int(deleted),
        "seconds": round(end, 1),
        "phases": phases,
        "steps": steps,
        "foreground": foreground,
        "env": WORKER_ENV,
        "when": now.isoformat(timespec="seconds"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=1))
    draw(result)
    report(result)


def report(result: dict) -> None:
    print(
        f"{result['rows']:,} rows, run {result['run_key']} ({result['run_state']},"
        f" {result['rows_deleted']:,} rows deleted in {result['seconds']} s);"
        f" reporting job from {result['phases']['pressure_from']:g} s"
        f" to {result['phases']['pressure_to']:g} s\n"
    )
    print(
        "| t (s) | action | at once | chunk ms | duty | probe p99 ms | idle ms (same rank) | inflation |"
    )
    print("|--:|---|--:|--:|--:|--:|--:|--:|")
    for s in result["steps"]:
        print(
            f"| {s['t']:.1f} | {s['action']} | {s['concurrency']} | {s['chunk_ms']} |"
            f" {s['duty_cycle']:.0%} | {_n(s['probe_p99_ms'])} | {_n(s['idle_p99_ms'])} |"
            f" {_n(s['inflation'])} |"
        )
    print("\n| t (s) | foreground p99 ms | ops |\n|--:|--:|--:|")
    for f in result["foreground"]:
        print(f"| {f['t']:.0f} | {f['p99_ms']:.1f} | {f['n']} |")


def _n(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def draw(result: dict) -> None:
    """Three panels over one time axis: foreground p99 (the load's own, and the probe's
    p99 the controller judged), chunk transactions at once, chunk target ms and duty cycle."""
    steps, fg = result["steps"], result["foreground"]
    end = max([s["t"] for s in steps] + [f["t"] for f in fg] + [1.0])
    w, left, right, top = 900, 70, 20, 62
    panel_h, gap = 150, 40
    height = top + 3 * panel_h + 2 * gap + 70
    x = lambda t: left + (w - left - right) * max(0.0, t) / end  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}"'
        f' viewBox="0 0 {w} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">The guard\'s latency'
        f" controller in a real run: {result['rows']:,} rows, 2 workers, foreground 200 ops/s"
        "</text>",
    ]
    p0, p1 = result["phases"]["pressure_from"], result["phases"]["pressure_to"]

    def panel(i: int, title: str, series: list, ymax: float, unit: str, log: bool = False) -> None:
        y0 = top + i * (panel_h + gap)
        if log:  # 1 .. ymax on a log scale
            span = math.log10(ymax)
            y = lambda v: y0 + panel_h - panel_h * math.log10(min(max(v, 1), ymax)) / span  # noqa: E731
        else:
            y = lambda v: y0 + panel_h - panel_h * min(v, ymax) / ymax  # noqa: E731
        parts.append(
            f'<rect x="{x(p0):.1f}" y="{y0}" width="{x(p1) - x(p0):.1f}" height="{panel_h}"'
            ' fill="#fdf0d5"/>'
        )
        parts.append(
            f'<rect x="{left}" y="{y0}" width="{w - left - right}" height="{panel_h}"'
            ' fill="none" stroke="#999"/>'
        )
        parts.append(f'<text x="{left}" y="{y0 - 6}" font-weight="bold">{title}</text>')
        ticks = [10**k for k in range(int(math.log10(ymax)) + 1)] if log else [0, ymax / 2, ymax]
        if ymax == 300:  # ms and percent share the axis: 0, 100, 200, 300
            ticks = [0, 100, 200, 300]
        for v in ticks:
            parts.append(
                f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}{unit}</text>'
            )
        for _name, color, points, dash, stairs in series:
            if not points:
                continue
            coords, last = [], None
            for t, v in points:
                if stairs and last is not None:  # a setting holds until the next step
                    coords.append((x(t), y(last)))
                coords.append((x(t), y(v)))
                last = v
            if stairs:
                coords.append((x(end), y(last)))
            path = " ".join(
                f"{'M' if k == 0 else 'L'}{cx:.1f},{cy:.1f}" for k, (cx, cy) in enumerate(coords)
            )
            extra = ' stroke-dasharray="5,3"' if dash else ""
            parts.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{extra}/>')
        lx = left + 10
        for name, color, _points, dash, _stairs in series:
            extra = ' stroke-dasharray="5,3"' if dash else ""
            parts.append(
                f'<line x1="{lx}" y1="{y0 + 12}" x2="{lx + 18}" y2="{y0 + 12}" stroke="{color}"'
                f' stroke-width="2"{extra}/><text x="{lx + 22}" y="{y0 + 16}">{name}</text>'
            )
            lx += 30 + 7 * len(name)

    fg_points = [(f["t"], f["p99_ms"]) for f in fg]
    probe = [(s["t"], s["probe_p99_ms"]) for s in steps if s["probe_p99_ms"] is not None]
    limit = [
        (s["t"], s["idle_p99_ms"] * s["budget"]) for s in steps if s["idle_p99_ms"] is not None
    ]
    ymax = 10 ** math.ceil(math.log10(max([v for _, v in fg_points + probe] + [10.0])))
    panel(
        0,
        "Foreground p99 per 2 s (the load's own) and the probe's p99 per controller step"
        " (log scale)",
        [
            ("foreground p99", "#c0392b", fg_points, False, False),
            ("probe p99", "#2c3e50", probe, False, False),
            ("budget × idle (same rank)", "#7f8c8d", limit, True, True),
        ],
        ymax,
        " ms",
        log=True,
    )
    top_of = result.get("ceilings") or {"concurrency": 2, "chunk_ms": 300, "duty_cycle": 0.5}

    # a run's first step (``start``) sets the floor before its first chunk: the stairs begin
    # there (a run recorded before runs started at the floor began at the policy's settings)
    def stairs(key: str, scale: float = 1.0) -> list:
        first = steps[0][key] if steps and steps[0]["action"] == "start" else top_of[key]
        return [(0.0, first * scale)] + [(s["t"], s[key] * scale) for s in steps]

    panel(
        1,
        "Chunk transactions at once",
        [("concurrency", "#2980b9", stairs("concurrency"), False, True)],
        top_of["concurrency"],
        "",
    )
    panel(
        2,
        "Chunk target duration (ms) and duty cycle (% of wall time)",
        [
            ("chunk target ms", "#27ae60", stairs("chunk_ms"), False, True),
            ("duty cycle %", "#8e44ad", stairs("duty_cycle", 100.0), True, True),
        ],
        top_of["chunk_ms"],
        "",
    )
    base_y = top + 3 * panel_h + 2 * gap + 20
    for t in range(0, int(end) + 1, 10):
        parts.append(f'<text x="{x(t):.1f}" y="{base_y}" text-anchor="middle">{t} s</text>')
    parts.append(
        f'<text x="{left}" y="{base_y + 22}" fill="#555">Shaded: a reporting job (two sessions'
        " of aggregates over the table) runs beside the foreground.</text>"
        f'<text x="{left}" y="{base_y + 38}" fill="#555">Drawn by bench/guard_controller.py from'
        f" the controller's recorded steps (runs_guardcontrolstep), {result['when']}.</text>"
    )
    parts.append("</svg>")
    SVG.parent.mkdir(parents=True, exist_ok=True)
    SVG.write_text("\n".join(parts) + "\n")
    log(f"wrote {SVG.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
