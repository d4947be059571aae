"""Benchmarks side by side: the product against a single DELETE and hand-written loops,
on identical copies of one fresh dataset, under the same foreground load, in one run.

    .venv/bin/python bench/run.py --quick          # 1M rows (+ 200k variants), < 3 minutes
    .venv/bin/python bench/run.py --full           # 1M and 10M rows (+ 1M variants)
    .venv/bin/python bench/run.py --sizes 1M --only single,product-2w --variants base
    .venv/bin/python bench/run.py --shapes all --sizes 1M   # the shape matrix (bench/dataset.py)
    .venv/bin/python bench/run.py --shapes interleaved-50,uuid-v4 --sizes 10M --only keyrange,product-2w

Prints the tables (Markdown), checks the targets as ratios of the same run, saves
``bench/results/<mode>.json`` and ``.md``, and draws ``docs/performance.svg`` (plus a PNG
when ``rsvg-convert`` or ImageMagick's ``convert`` is installed). See bench/README.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from bench import dataset, product, report
from bench.common import (
    BENCH_DB,
    ROOT,
    SCHEMA,
    machine_busy_s,
    percentile,
    server_url,
    with_database,
)

RESULTS = ROOT / "bench" / "results"

CONTENDERS: dict[str, dict] = {
    "single": {"kind": "loop", "loop": "single", "label": "single DELETE (ceiling)"},
    "naive": {"kind": "loop", "loop": "naive", "label": "naive IN (SELECT … LIMIT n) loop"},
    "keyrange": {"kind": "loop", "loop": "keyrange", "label": "key-range loop"},
    "keyrange-2": {"kind": "loop", "loop": "keyrange", "connections": 2,
                   "label": "key-range loop, 2 connections at once"},
    "product-1w": {"kind": "product", "workers": 1, "guard": False, "label": "product, 1 worker, guard off"},
    "product-2w": {"kind": "product", "workers": 2, "guard": False, "label": "product, 2 workers, guard off"},
    "product-2w-guard": {"kind": "product", "workers": 2, "guard": True, "label": "product, 2 workers, guard on"},
    "product-1w-guard": {"kind": "product", "workers": 1, "guard": True, "label": "product, 1 worker, guard on"},
    "product-2w-guard-sparse": {
        "kind": "product", "workers": 2, "guard": True, "env": {"RETENTION_GUARD_PROBE_MS": "500"},
        "label": "product, 2 workers, guard on, no probes between samples",
    },
    "product-2w-guard-nothread": {
        "kind": "product", "workers": 2, "guard": True, "env": {"RETENTION_GUARD_SAMPLER_THREAD": "0"},
        "label": "product, 2 workers, guard on, samples by the admissions alone",
    },
    "product-2w-nice": {
        "kind": "product", "workers": 2, "guard": False, "nice": 10,
        "label": "product, 2 workers, guard off, worker processes at nice 10",
    },
    "product-2w-guard-nice": {
        "kind": "product", "workers": 2, "guard": True, "nice": 10,
        "label": "product, 2 workers, guard on, worker processes at nice 10",
    },
    "product-2w-async": {
        "kind": "product", "workers": 2, "guard": False, "sync_commit": False,
        "label": "product, 2 workers, guard off, synchronous_commit off",
    },
    "copyout": {"kind": "loop", "loop": "copyout", "archive": True,
                "label": "COPY out, then DELETE by key range (hand-written archive loop)"},
    "archive-1w": {"kind": "product", "workers": 1, "guard": False, "archive": True,
                   "label": "product, 1 worker, guard off, archive then delete"},
    "archive-2w": {"kind": "product", "workers": 2, "guard": False, "archive": True,
                   "label": "product, 2 workers, guard off, archive then delete"},
    "archive-table-1w": {"kind": "product", "workers": 1, "guard": False, "archive_table": True,
                         "label": "product, 1 worker, guard off, archive to a table then delete"},
    "product-2w-tenant": {
        "kind": "product", "workers": 2, "guard": False, "tenant": True,
        "label": "product, 2 workers, guard off, per-tenant chunks",
    },
}  # fmt: skip
VARIANT_CONTENDERS = ("single", "keyrange", "product-2w")
MATRIX_CONTENDERS = ("single", "naive", "keyrange", "product-1w", "product-2w", "product-2w-guard")

MODES = {
    "quick": {"sizes": ["1M"], "variant_rows": "200k", "idle_s": 4.0, "time_cap_s": 60.0},
    "full": {"sizes": ["1M", "10M"], "variant_rows": "1M", "idle_s": 10.0, "time_cap_s": 150.0},
    # --shapes: every shape of the matrix at every size, the six MATRIX_CONTENDERS on each.
    "matrix": {"sizes": ["1M"], "idle_s": 6.0, "time_cap_s": 90.0, "time_cap_10m_s": 180.0},
}


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.server = server_url()
        self.url = with_database(self.server, BENCH_DB)
        self.stamp = format(int(time.time()), "x")[-6:]
        self.logs = RESULTS / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        # The tick of the daily schedule "0 0 * * *" at or before now: the product's run and the
        # loops share its cutoff.
        self.tick = now.replace(hour=0, minute=0, second=0, microsecond=0)
        self.cutoff = dataset.cutoff_for(self.tick)

    # -- infrastructure -------------------------------------------------------
    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def prepare_database(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as admin:
            exists = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]
            ).fetchone()
            if not exists:
                admin.execute(f'CREATE DATABASE "{BENCH_DB}"')
        env = self.child_env()
        for cmd in (["migrate", "--no-input", "-v", "0"], ["createcachetable"]):
            subprocess.run([sys.executable, "manage.py", *cmd], cwd=ROOT, env=env, check=True)
        self.conn = psycopg.connect(self.url, autocommit=True, application_name="bench-run")
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        self.walinspect = False
        if not self.args.no_wal_attribution:
            try:
                self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self.walinspect = True
            except psycopg.Error:
                self.walinspect = False
        self.db_oid = self.conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]

    def child_env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.url, RETENTION_DEMO="1", DEBUG="0", LOG_LEVEL="WARNING",
            PYTHONPATH=str(ROOT),
        )  # fmt: skip
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(
        self, module: str, *args: str, env: dict | None = None, tag: str, nice: int = 0
    ) -> subprocess.Popen:
        err = open(self.logs / f"{tag}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*(["nice", "-n", str(nice)] if nice else []), sys.executable, "-m", module, *args],
            cwd=ROOT, env=env or self.child_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        proc.tag = tag  # type: ignore[attr-defined]
        return proc

    def wait_ready(self, proc: subprocess.Popen) -> None:
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            raise SystemExit(f"{proc.tag} did not start ({line!r}); see {self.logs / proc.tag}.log")

    def finish(self, proc: subprocess.Popen, send: str | None = None) -> dict:
        out, _ = proc.communicate(input=send, timeout=self.args.timeout)
        lines = [x for x in out.splitlines() if x.strip()]
        if proc.returncode != 0 or not lines:
            raise SystemExit(
                f"{proc.tag} failed (exit {proc.returncode}); see {self.logs / proc.tag}.log"
            )
        return json.loads(lines[-1])

    def xacts(self) -> int:
        """Transactions committed and rolled back in the bench database so far (as the
        server's statistics hold them: flushed by each session within a second)."""
        return self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()[0]

    def lsn(self) -> str:
        return self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]

    def wal_bytes(self, start: str, end: str) -> tuple[int, int]:
        """WAL written between two LSNs, and the part of it that belongs to other databases
        of the server (other users' work during the measurement), when pg_walinspect is there."""
        total = self.conn.execute(
            "SELECT pg_wal_lsn_diff(%s, %s)::bigint", [end, start]
        ).fetchone()[0]
        other = 0
        if self.walinspect and total > 0:
            try:
                other = self._other_wal(start, end)
            except psycopg.Error:  # the segments were recycled already (a checkpoint in between)
                other = None
        return total, other

    def _other_wal(self, start: str, end: str) -> int:
        return self.conn.execute(
            "SELECT coalesce(sum(record_length), 0)::bigint FROM ("
            " SELECT DISTINCT ON (start_lsn) start_lsn, record_length"
            " FROM pg_get_wal_block_info(%s, %s, false)"
            " WHERE reldatabase NOT IN (0, %s)) AS r",
            [start, end, self.db_oid],
        ).fetchone()[0]

    def archive_dir_of(self, tag: str) -> Path:
        root = Path(os.environ.get("BENCH_ARCHIVE_DIR", ROOT / ".bench" / "archive"))
        return root / tag

    def archive_dir(self, tag: str) -> Path:
        """An empty directory for a contender's archive files (``BENCH_ARCHIVE_DIR``, default
        ``.bench/archive``), emptied again after the contender (``archive_bytes``)."""
        path = self.archive_dir_of(tag)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    # -- one contender ------------------------------------------------------
    def load_spec(self, table: str, rows: int, variant: str) -> dict:
        shape = dataset.shape_of(variant)
        return {
            "dsn": self.url, "table": table, "rate": self.args.rate, "seed": 7,
            "cutoff": self.cutoff.isoformat(), "pk": list(shape.pk), "key_kind": shape.key_kind,
            "tenant_order": shape.tenant_read_order, "payload_bytes": 2500 if shape.toast else 90,
        }  # fmt: skip

    def idle_baseline(self, template: str, rows: int, variant: str, seconds: float) -> dict:
        table = dataset.copy_name(variant, "idle")
        dataset.make_copy(self.conn, template, variant, table)
        load = self.spawn(
            "bench.load",
            json.dumps(self.load_spec(table, rows, variant)),
            tag=f"{variant}-{rows}-idle-load",
        )
        self.wait_ready(load)
        load.stdin.write("go\n")
        load.stdin.flush()
        time.sleep(seconds)
        result = self.finish(load, "stop\n")
        dataset.drop_copy(self.conn, table)
        return foreground_stats(result["ops"], result["t0"], result["t0"], result["t0"] + seconds)

    def run_contender(
        self, name: str, template: str, facts: dict, variant: str, mode: dict, turn: int = 0
    ) -> dict:
        spec = CONTENDERS[name]
        shape = dataset.shape_of(variant)
        rows = facts["rows"]
        table = dataset.copy_name(variant, name)
        tag = f"{variant}-{dataset.size_label(rows)}-{name}"
        self.log(f"{tag}: copying {template}")
        copy = dataset.make_copy(self.conn, template, variant, table)
        result: dict = {"contender": name, "label": spec["label"], "variant": variant, "rows_in_table": rows,
                        "eligible": facts["eligible"], "copy_s": round(copy["seconds"], 2)}  # fmt: skip
        setup = None
        workers: list[subprocess.Popen] = []
        if spec["kind"] == "loop":
            loop_spec = {
                "dsn": self.url, "table": table, "kind": spec["loop"], "cutoff": self.cutoff.isoformat(),
                "chunk_size": self.args.chunk_size, "time_cap_s": self.time_cap(mode, rows),
                "pk": list(shape.pk), "int_key": shape.int_key,
                "connections": spec.get("connections", 1),
                "archive_dir": str(self.archive_dir(tag)) if spec.get("archive") else None,
            }  # fmt: skip
            workers.append(self.spawn("bench.loops", json.dumps(loop_spec), tag=tag))
        else:
            env = self.child_env(
                RETENTION_GUARD="1" if spec["guard"] else "0",
                RETENTION_SYNCHRONOUS_COMMIT="0" if spec.get("sync_commit") is False else "1",
                CLEANUP_WORKERS=spec["workers"],
                **spec.get("env", {}),
            )
            setup_spec = {
                # a policy of its own per turn (``--repeat``): its run is a new one
                "slug": f"b{self.stamp}-{variant}-{dataset.size_label(rows).lower()}-{name}"
                + (f"-r{turn + 1}" if turn else ""),
                "table": table, "retention": f"{dataset.RETENTION_DAYS} days",
                "chunk_size": self.args.chunk_size, "target_chunk_ms": self.args.target_chunk_ms,
                "workers": spec["workers"], "tenant": spec.get("tenant", shape.tenant_policy),
                "key": shape.policy_key,
                "cascade_ack": [f"{SCHEMA}.{table}_items"] if shape.cascade else [],
                "tick": self.tick.isoformat(), "cutoff": self.cutoff.isoformat(),
                "archive_dir": str(self.archive_dir(tag)) if spec.get("archive") else None,
                "archive_table": bool(spec.get("archive_table")),
            }  # fmt: skip
            proc = self.spawn(
                "bench.product", "setup", json.dumps(setup_spec), env=env, tag=tag + "-setup"
            )
            setup = self.finish(proc)
            result["setup"] = setup
            if "refused" in setup:
                self.log(f"{tag}: refused: {setup['refused']}")
                dataset.drop_copy(self.conn, table)
                result.update(refused=setup["refused"], rows=0, capped=False, rows_per_s=None,
                              wal_per_row=None, chunks={}, foreground={}, worker_rss_kb=None)  # fmt: skip
                return result
            for i in range(spec["workers"]):
                workers.append(
                    self.spawn(
                        "bench.product",
                        "drain",
                        json.dumps(
                            {
                                "run_key": setup["run_key"],
                                "time_cap_s": self.time_cap(mode, rows),
                            }
                        ),
                        env=env,
                        tag=f"{tag}-w{i}",
                        nice=spec.get("nice", 0),
                    )  # fmt: skip
                )
        load = self.spawn(
            "bench.load", json.dumps(self.load_spec(table, rows, variant)), tag=tag + "-load"
        )
        for proc in [*workers, load]:
            self.wait_ready(proc)
        self.conn.execute("CHECKPOINT")
        lsn0 = self.lsn()
        xacts0 = self.xacts()
        load.stdin.write("go\n")
        load.stdin.flush()
        time.sleep(0.2)  # the load runs a moment before cleanup starts
        busy0, span0 = machine_busy_s(), time.monotonic()
        for proc in workers:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        self.log(f"{tag}: running")
        outs = [self.finish(proc) for proc in workers]
        busy, span = machine_busy_s() - busy0, time.monotonic() - span0
        lsn1 = self.lsn()
        fg = self.finish(load, "stop\n")
        time.sleep(1.1)  # every session has flushed its statistics
        xacts = self.xacts() - xacts0 - 2 - len(fg["ops"])  # not this session's, not the load's
        started, ended = min(o["started"] for o in outs), max(o["ended"] for o in outs)
        wall = ended - started
        # where the machine's CPU went while the contender ran (from its release to its
        # processes' exit): all of it, the contender's processes, their main backends (the
        # rest: the foreground, its backend, the server's own, the processes' exit)
        parts = [o.get("cpu") or {} for o in outs]
        result["cpu"] = {
            "busy_cores": round(busy / span, 2) if span > 0 else None,
            "busy_s": round(busy, 3),
            "workers_s": round(sum(c.get("self_s") or 0 for c in parts), 3),
            "backends_s": round(sum(c.get("backends_s") or 0 for c in parts), 3),
        }
        if spec["kind"] == "loop":
            out = outs[0]
            deleted, capped = out["rows"], out["capped"]
            chunks = [
                {"pid": 0, "start": c[0], "seconds": c[1], "rows": c[2]} for c in out["chunks"]
            ]
        else:
            capped = any(o.get("capped") for o in outs)
            chunks = self.ledger(setup["run_id"])
            deleted = sum(c["rows"] for c in chunks)
            result["run_state"] = self.conn.execute(
                "SELECT state || coalesce(': ' || nullif(state_reason, ''), '') FROM retention_runner.runs_run WHERE id = %s",
                [setup["run_id"]],
            ).fetchone()[0]
            result["worker_summaries"] = [o["summary"] for o in outs]
            if spec["guard"]:
                result["controller"] = self.controller(setup["run_id"])
                # the controller's own report over the run (``retention status``): its
                # verdict, and what the guard's probe saw over the whole run beside what the
                # foreground saw
                report = self.status(setup["run_key"]).get("guard_over_run") or {}
                result["budget_report"] = report
                pooled = report.get("pooled") or {}
                result["probe"] = {
                    "n": pooled.get("readings", 0),
                    "p99": pooled.get("p99_ms"),
                    "idle": pooled.get("baseline_ms"),
                    "idle_rank": pooled.get("rank"),
                }
            result["xacts_per_chunk"] = round(xacts / len(chunks), 1) if chunks else None
            if chunks:  # where the wall went: before the first chunk, the chunks, after them
                first = min(c["start"] for c in chunks)
                last = max(c["start"] + c["seconds"] for c in chunks)
                result["phases"] = {
                    "release_to_first_chunk_s": round(first - started, 3),
                    "chunk_span_s": round(last - first, 3),
                    "last_commit_to_end_s": round(ended - last, 3),
                }
        total_wal, other_wal = self.wal_bytes(lsn0, lsn1)
        remaining = dataset.remaining_eligible(self.conn, table, self.cutoff)
        result.update(
            rows=deleted, capped=capped, wall_s=round(wall, 3),
            rows_per_s=deleted / wall if wall > 0 else None,
            wal_bytes=total_wal - (other_wal or 0), wal_other_db_bytes=other_wal,
            wal_per_row=(total_wal - (other_wal or 0)) / deleted if deleted else None,
            remaining_eligible=remaining,
            worker_rss_kb=max(o["rss_kb"] for o in outs),
            setup_rss_kb=setup["rss_kb"] if setup else None,
            chunks=chunk_stats(chunks),
            foreground=foreground_stats(fg["ops"], fg["t0"], started, ended, chunks),
        )  # fmt: skip
        if shape.cascade:
            result["orphans"] = dataset.orphans(self.conn, table)
        if spec.get("archive"):  # what the archive wrote, then removed (the disk is shared)
            files = [p for p in self.archive_dir_of(tag).rglob("*") if p.is_file()]
            result["archive_bytes"] = sum(p.stat().st_size for p in files)
            result["archive_files"] = len(files)
            self.log(f"{tag}: archive {len(files)} files, {result['archive_bytes']:,} bytes")
            shutil.rmtree(self.archive_dir_of(tag), ignore_errors=True)
        if spec.get("archive_table"):  # the archive table's rows, then the table (disk is shared)
            result["archive_rows"] = self.conn.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(
                    sql.Identifier(product.ARCHIVE_SCHEMA), sql.Identifier(table)
                )
            ).fetchone()[0]
            self.log(f"{tag}: archive table {result['archive_rows']:,} rows")
            product.drop_archive_table(self.conn, table)
        if remaining and not capped:
            self.log(f"{tag}: WARNING {remaining} eligible rows left")
        dataset.drop_copy(self.conn, table)
        self.log(
            f"{tag}: {deleted:,} rows in {wall:.2f}s = {result['rows_per_s'] or 0:,.0f} rows/s,"
            f" fg p99 {result['foreground']['p99']} ms; cores busy {result['cpu']['busy_cores']},"
            f" CPU s: backends {result['cpu']['backends_s']}, workers {result['cpu']['workers_s']},"
            f" all {result['cpu']['busy_s']}"
        )
        return result

    def explain(self, template: str, facts: dict, variant: str) -> str:
        """``retention explain`` of the 2-worker product policy on a fresh copy of the shape
        (after its contenders, so its reads warm nobody's cache); the plans are written to
        ``bench/results/explain-<size>/<shape>.txt``. Returns that path."""
        shape = dataset.shape_of(variant)
        rows = facts["rows"]
        table = dataset.copy_name(variant, "explain")
        tag = f"{variant}-{dataset.size_label(rows)}-explain"
        self.log(f"{tag}: copying {template}")
        dataset.make_copy(self.conn, template, variant, table)
        spec = {
            "slug": f"b{self.stamp}-{variant}-{dataset.size_label(rows).lower()}-explain",
            "table": table, "retention": f"{dataset.RETENTION_DAYS} days",
            "chunk_size": self.args.chunk_size, "target_chunk_ms": self.args.target_chunk_ms,
            "workers": 2, "tenant": shape.tenant_policy, "key": shape.policy_key,
            "cascade_ack": [f"{SCHEMA}.{table}_items"] if shape.cascade else [],
        }  # fmt: skip
        result = self.finish(
            self.spawn("bench.product", "explain", json.dumps(spec), tag=tag, env=self.child_env())
        )
        dataset.drop_copy(self.conn, table)
        folder = RESULTS / f"explain-{dataset.size_label(rows)}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{variant}.txt"
        path.write_text(result.get("plans") or f"refused: {result.get('refused')}\n")
        self.log(f"{tag}: plans in {path.relative_to(ROOT)}")
        return str(path.relative_to(ROOT))

    def time_cap(self, mode: dict, rows: int) -> float:
        if self.args.time_cap:
            return self.args.time_cap
        if rows >= 10_000_000 and "time_cap_10m_s" in mode:
            return mode["time_cap_10m_s"]
        return mode["time_cap_s"]

    def controller(self, run_id: int) -> list[dict]:
        """The guard controller's steps for the run's policy, as it recorded them: what it saw
        (probe p99 against its idle baseline and the budget), what it did and why."""
        rows = self.conn.execute(
            "SELECT extract(epoch FROM s.taken_at), s.action, s.concurrency, s.chunk_ms,"
            " s.duty_cycle, s.probe_p99_ms, s.baseline_ms, s.inflation, s.budget, s.reason"
            " FROM retention_runner.runs_guardcontrolstep s"
            " JOIN retention_runner.runs_run r ON r.policy_id = s.policy_id"
            " WHERE r.id = %s ORDER BY s.taken_at, s.id",
            [run_id],
        ).fetchall()
        keys = ("at", "action", "concurrency", "chunk_ms", "duty_cycle", "probe_p99_ms",
                "baseline_ms", "inflation", "budget", "reason")  # fmt: skip
        return [dict(zip(keys, (float(r[0]), *r[1:]), strict=True)) for r in rows]

    def status(self, run_key: str) -> dict:
        """``retention status RUN_KEY --json``: the run as the product reports it."""
        out = subprocess.run(
            [sys.executable, "manage.py", "retention", "status", run_key, "--json"],
            cwd=ROOT, env=self.child_env(), check=True, capture_output=True, text=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    def ledger(self, run_id: int) -> list[dict]:
        rows = self.conn.execute(
            "SELECT worker_pid, extract(epoch FROM started_at), extract(epoch FROM committed_at),"
            " rows_deleted FROM retention_runner.runs_auditrecord WHERE run_id = %s ORDER BY started_at",
            [run_id],
        ).fetchall()
        return [
            {"pid": pid, "start": float(s), "seconds": float(c) - float(s), "rows": n}
            for pid, s, c, n in rows
        ]

    def repeats(self, rows: int) -> int:
        """How many times each contender runs on a table of ``rows`` (``--repeat``)."""
        for item in (self.args.repeat or "").split(","):
            size, _, times = item.partition("=")
            if size and dataset.parse_size(size) == rows:
                return int(times)
        return 1

    def shapes(self) -> list[str]:
        wanted = self.args.shapes
        names = list(dataset.SHAPES) if wanted in (None, "all") else wanted.split(",")
        for name in names:
            dataset.shape_of(name)  # an unknown name stops here, before any work
        return names

    # -- the whole run ------------------------------------------------------
    def main(self) -> dict:
        args = self.args
        mode = MODES[args.mode]
        sizes = [
            dataset.parse_size(s) for s in (args.sizes.split(",") if args.sizes else mode["sizes"])
        ]
        only = args.only.split(",") if args.only else None
        default_names = [n for n in CONTENDERS if n != "product-2w-tenant" or args.mode == "full"]
        names = only or default_names
        variants = args.variants.split(",") if args.variants else list(dataset.VARIANTS)
        t_start = time.monotonic()
        self.log(
            f"bench database {BENCH_DB}; tick {self.tick:%Y-%m-%d}, cutoff {self.cutoff:%Y-%m-%d}"
        )
        self.prepare_database()
        out = {
            "mode": args.mode, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(), "server": self.conn.execute("SHOW server_version").fetchone()[0],
            "chunk_size": args.chunk_size, "target_chunk_ms": args.target_chunk_ms, "rate": args.rate,
            "retention_days": dataset.RETENTION_DAYS, "runs": [], "idle": {}, "datasets": {},
            "load": {}, "commit": commit(),
        }  # fmt: skip
        if args.mode == "matrix":
            out["matrix"] = True
            names = only or list(MATRIX_CONTENDERS)
            skip = set(args.skip.split(",")) if args.skip else set()
            plan = [
                (rows, shape, names)
                for rows in sizes
                for shape in self.shapes()
                if f"{shape}/{dataset.size_label(rows)}" not in skip
            ]
        else:
            plan = [(rows, "base", names) for rows in sizes]
            variant_rows = dataset.parse_size(mode["variant_rows"])
        for variant in variants if args.mode != "matrix" else ():
            if variant != "base":
                plan.append((variant_rows, variant, [n for n in names if n in VARIANT_CONTENDERS]))
        for rows, variant, contenders in plan:
            if not contenders:
                continue
            self.log(f"dataset {variant} {dataset.size_label(rows)}: generating")
            facts = dataset.create_template(self.conn, rows, variant, self.tick)
            key = f"{variant}/{dataset.size_label(rows)}"
            out["datasets"][key] = facts
            self.log(
                f"dataset {key}: {facts['eligible']:,} eligible of {rows:,} ({facts['seconds']:.1f}s)"
            )
            out["idle"][key] = self.idle_baseline(facts["table"], rows, variant, mode["idle_s"])
            out["load"].setdefault(key, []).append(load_average())
            self.log(f"idle {key}: fg p99 {out['idle'][key]['p99']} ms")
            # each contender ``--repeat`` times at this size, in turns (1w, 2w, …, 1w, 2w, …)
            # so that a slow minute of a shared machine falls on all of them alike; the run
            # of median rate stands for the contender, with every run's figures beside it
            tried: dict[str, list[dict]] = {name: [] for name in contenders}
            for turn in range(self.repeats(rows)):
                for name in contenders:
                    res = self.run_contender(name, facts["table"], facts, variant, mode, turn)
                    res["dataset"] = key
                    tried[name].append(res)
            out["runs"].extend(median_run(runs) for runs in tried.values())
            out["load"][key].append(load_average())
            if args.explain and args.mode == "matrix":
                out.setdefault("explain", {})[key] = self.explain(facts["table"], facts, variant)
            dataset.drop_copy(self.conn, facts["table"])
        out["total_s"] = round(time.monotonic() - t_start, 1)
        return out


def median_run(runs: list[dict]) -> dict:
    """The run of median rate among a contender's repeated runs (the lower middle of an even
    count), with each run's rate, wall time and foreground p99 in ``repeats``."""
    if len(runs) == 1:
        return runs[0]
    ranked = sorted(runs, key=lambda r: r.get("rows_per_s") or 0.0)
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["repeats"] = [
        {
            "rows_per_s": r.get("rows_per_s"),
            "wall_s": r.get("wall_s"),
            "fg_p99": (r.get("foreground") or {}).get("p99"),
        }
        for r in runs
    ]
    return chosen


def chunk_stats(chunks: list[dict]) -> dict:
    """Chunk durations (p50/p99/max), flatness (median of the last 10% of chunks over the first
    10%, in start order) and per-chunk overhead: for each worker, the time between one chunk's
    end and its next chunk's start (dispatch, claim, admission, audit, commit, ack, planning)."""
    work = [c for c in chunks if c["rows"] > 0]
    if not work:
        return {"count": 0}
    secs = [c["seconds"] * 1000 for c in work]
    tenth = max(1, len(work) // 10)
    head = percentile([c["seconds"] for c in work[:tenth]], 50)
    tail = percentile([c["seconds"] for c in work[-tenth:]], 50)
    gaps: list[float] = []
    by_pid: dict = {}
    for c in chunks:
        by_pid.setdefault(c["pid"], []).append(c)
    for items in by_pid.values():
        items.sort(key=lambda c: c["start"])
        for a, b in zip(items, items[1:], strict=False):
            gaps.append((b["start"] - a["start"] - a["seconds"]) * 1000)
    return {
        "count": len(chunks),
        "rows_mean": sum(c["rows"] for c in work) / len(work),
        "p50_ms": percentile(secs, 50),
        "p99_ms": percentile(secs, 99),
        "max_ms": max(secs),
        "flatness": tail / head if head else None,
        "overhead_p50_ms": percentile(gaps, 50),
        "overhead_p90_ms": percentile(gaps, 90),
    }


def foreground_stats(
    ops: list, t0: float, start: float, end: float, chunks: list[dict] | None = None
) -> dict:
    """Latency percentiles (ms, from the scheduled time) of the foreground operations scheduled
    inside [start, end] (epoch seconds); ``t0`` is the epoch of the load's schedule origin.
    With the cleanup's ``chunks`` (``start`` epoch, ``seconds``): the same split into the
    operations that overlapped a chunk transaction and those that did not."""
    inside = [op for op in ops if start <= t0 + op[0] <= end]
    lat = [op[1] for op in inside]
    if not lat:
        return {"n": 0}
    kinds = sorted({op[2] for op in inside})
    split = {}
    if chunks:
        during, between = overlap_split(inside, t0, chunks)

        def part(ops: list) -> dict:
            by_kind = {k: [op[1] for op in ops if op[2] == k] for k in kinds}
            return {
                "n": len(ops),
                "p99": percentile([op[1] for op in ops], 99),
                "p99_by_kind": {k: percentile(v, 99) for k, v in by_kind.items() if v},
            }

        # what a request waits for while a chunk transaction runs, and outside one
        split = {"during_chunks": part(during), "between_chunks": part(between)}
    return {
        **split,
        "n": len(lat),
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "p99": percentile(lat, 99),
        "max": max(lat),
        "over_50ms": sum(1 for x in lat if x > 50),
        # where each stall began: the first of consecutive requests over 50 ms, seconds after
        # the cleanup's release, with the longest latency of the run of them (at most 10)
        "stalls": stalls(inside, t0, start),
        # which requests the cleanup slows: point reads, a tenant's latest rows, inserts
        "p99_by_kind": {k: percentile([op[1] for op in inside if op[2] == k], 99) for k in kinds},
    }


def stalls(ops: list, t0: float, start: float, over_ms: float = 50.0) -> list[dict]:
    """The stalls among ``ops`` (in schedule order): each run of consecutive requests over
    ``over_ms`` as when its first was scheduled (seconds after ``start``), how many requests it
    held up and the longest latency among them; the first 10."""
    found: list[dict] = []
    current: dict | None = None
    for op in ops:
        if op[1] <= over_ms:
            current = None
            continue
        if current is None:
            if len(found) == 10:
                break
            current = {"at_s": round(t0 + op[0] - start, 3), "requests": 0, "max_ms": 0.0}
            found.append(current)
        current["requests"] += 1
        current["max_ms"] = max(current["max_ms"], op[1])
    return found


def overlap_split(ops: list, t0: float, chunks: list[dict]) -> tuple[list, list]:
    """The ``ops`` (scheduled offset from ``t0``, latency ms, kind) that started while a chunk
    transaction was in flight, and the others. By the start, not the whole span: a request
    that is slow for another reason spans more time and would overlap a chunk more often."""
    spans = sorted((c["start"], c["start"] + c["seconds"]) for c in chunks)
    starts = [s for s, _ in spans]
    reach = []  # the latest end of any chunk starting at or before each one
    for _, e in spans:
        reach.append(max(e, reach[-1]) if reach else e)
    during, between = [], []
    for op in ops:
        a = t0 + op[0]
        i = bisect.bisect_right(starts, a) - 1  # the last chunk that started before this op
        (during if i >= 0 and reach[i] >= a else between).append(op)
    return during, between


def load_average() -> str:
    """The machine's load average (1, 5, 15 min), as ``uptime`` prints it."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def machine() -> dict:
    info = {"cpus": os.cpu_count()}
    try:
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["mem_gb"] = round(int(mem) / 1024 / 1024)
        model = [
            x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name")
        ]
        info["cpu"] = model[0].split(":", 1)[1].strip() if model else ""
    except OSError:
        pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="mode", action="store_const", const="quick")
    group.add_argument("--full", dest="mode", action="store_const", const="full")
    group.add_argument("--matrix", dest="mode", action="store_const", const="matrix")
    parser.set_defaults(mode="quick")
    parser.add_argument(
        "--shapes",
        help=f"the shape matrix (implies --matrix): all or comma-separated of {', '.join(dataset.SHAPES)}",
    )
    parser.add_argument(
        "--sizes", help="comma-separated table sizes, e.g. 1M,10M (default by mode)"
    )
    parser.add_argument("--only", help=f"comma-separated contenders: {', '.join(CONTENDERS)}")
    parser.add_argument("--variants", help="comma-separated: base,toast,cascade (default all)")
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--target-chunk-ms", type=int, default=300)
    parser.add_argument(
        "--rate", type=float, default=200.0, help="foreground operations per second"
    )
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="seconds before a contender is given up"
    )
    parser.add_argument("--no-wal-attribution", action="store_true",
                        help="do not subtract other databases' WAL (pg_walinspect)")  # fmt: skip
    parser.add_argument("--time-cap", type=float, help="seconds after which a contender is stopped")
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument(
        "--skip", help="with --shapes: comma-separated SHAPE/SIZE pairs left out, e.g. toast/10M"
    )
    parser.add_argument(
        "--explain", action="store_true",
        help="with --shapes: save `retention explain` of each shape's policy (bench/results/explain-<size>/)",
    )  # fmt: skip
    parser.add_argument(
        "--repeat",
        help="SIZE=N[,SIZE=N]: run each contender N times on tables of SIZE, in turns, and report"
        " the run of median rate (e.g. 1M=3: a run of half a second swings with the machine)",
    )
    parser.add_argument(
        "--report", type=Path, help="only redraw tables and chart from a results JSON"
    )
    parser.add_argument(
        "--out",
        help="name of the results files (bench/results/OUT.json and .md) instead of the mode's;"
        " refused if they exist already",
    )
    args = parser.parse_args()
    if args.shapes:
        args.mode = "matrix"
    if args.report:
        data = json.loads(args.report.read_text())
        print(report.markdown(data))
        if not args.no_chart:
            svg = ROOT / "docs" / "performance.svg"
            svg.write_text(report.svg_chart(data))
            print(f"chart: {svg}, {report.to_png(svg)}")
        return
    if args.out and any((RESULTS / f"{args.out}{ext}").exists() for ext in (".json", ".md")):
        parser.error(f"bench/results/{args.out}.json or .md exists already")
    data = Bench(args).main()
    RESULTS.mkdir(exist_ok=True)
    if args.out:
        name = args.out
    elif args.mode == "matrix":
        sizes = args.sizes or ",".join(MODES["matrix"]["sizes"])
        name = f"matrix-{sizes.replace(',', '-')}" + (
            "-partial" if args.only or args.shapes not in (None, "all") else ""
        )
    else:
        name = (
            args.mode if not (args.only or args.sizes or args.variants) else f"{args.mode}-partial"
        )
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    text = report.markdown(data)
    (RESULTS / f"{name}.md").write_text(text)
    print(text)
    if not args.no_chart:
        if args.mode == "matrix":
            svg = ROOT / "docs" / f"performance-{name}.svg"
        else:
            svg = ROOT / "docs" / "performance.svg" if name in MODES else RESULTS / f"{name}.svg"
        svg.write_text(report.svg_chart(data))
        png = report.to_png(svg)
        print(
            f"chart: {svg}"
            + (f", {png}" if png else " (no PNG: install librsvg2-bin or ImageMagick)")
        )
    print(f"total {data['total_s']:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
