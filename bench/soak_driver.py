"""The chaos soak's driver: its own database, the worker processes it supervises, each epoch's
table and policy, the operator who converges the runs, and the loop that injects faults
(a mixin of ``bench.soak.Soak``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.soak_common import (
    DRIVER_APP,
    ENGINE_ENV,
    MAX_SUPERSEDES,
    ROOT,
    SIGTERM_GRACE_S,
    SOAK_DB,
    SOAK_TEMPLATE,
    Epoch,
    Fault,
    Worker,
    log,
)
from bench.soak_faults import FAULTS


class Driver:
    def __init__(self, args) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.faults: list[Fault] = []
        self.actions: Counter = Counter()  # operator actions the driver took to converge
        self.problems: list[str] = []
        self.checks_passed = 0
        self.pending: list[tuple[float, str, object]] = []  # (due, label, callable)
        self.verify_later: list[tuple[float, Fault, object]] = []  # (deadline, fault, predicate)
        self.workers: list[Worker] = []
        self.logdir = Path(args.logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.active_holds = 0
        self.epoch: Epoch | None = None
        self.epochs: list[Epoch] = []

    # -- infrastructure -----------------------------------------------------------------
    def start_database(self) -> None:
        from bench.common import with_database
        from core import embedded_pg

        t0 = time.monotonic()
        server = embedded_pg.database_url()
        import psycopg

        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{SOAK_DB}" WITH (FORCE)')
            # a data directory that served a soak before (--pgdata) holds its migrated
            # database as a template: cloning it skips the migrations (migrate below then
            # only confirms it is current)
            template = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [SOAK_TEMPLATE]
            ).fetchone()
            if template:
                admin.execute(f'CREATE DATABASE "{SOAK_DB}" TEMPLATE "{SOAK_TEMPLATE}"')
            else:
                admin.execute(f'CREATE DATABASE "{SOAK_DB}"')
        self.url = with_database(server, SOAK_DB)
        os.environ.update(ENGINE_ENV)
        os.environ.update(RETENTION_DEMO="1", DEBUG="0")
        joiner = "&" if "?" in self.url else "?"
        os.environ["DATABASE_URL"] = f"{self.url}{joiner}application_name={DRIVER_APP}"
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        call_command("createcachetable", verbosity=0)
        if not template:
            from django.db import connection

            connection.close()  # a template has no session
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{SOAK_TEMPLATE}" TEMPLATE "{SOAK_DB}"')
        log(
            f"database ready in {time.monotonic() - t0:.1f}s on {self.url}"
            f"{' (from its template)' if template else ''}"
        )

    def child_env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(ENGINE_ENV)
        env.update(
            DATABASE_URL=self.url, RETENTION_DEMO="1", DEBUG="0", RR_PGDATA=self.args.pgdata,
            PYTHONPATH=str(ROOT),
        )  # fmt: skip
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.update(extra)
        return env

    def db(self, fn, *, attempts: int = 20):
        """Run ``fn`` on the driver's connection, reconnecting after a lost connection."""
        from django.db import InterfaceError, OperationalError, connection

        for i in range(attempts):
            try:
                return fn()
            except (OperationalError, InterfaceError) as exc:
                if i == attempts - 1:
                    raise
                log(f"driver reconnects after: {str(exc).strip().splitlines()[0][:120]}")
                connection.close()
                time.sleep(0.5)
        return None

    def raw(self, application_name: str = "soak-fault"):
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(self.url)
        params["application_name"] = application_name
        # the product's tables in their own schema first, as the product's own sessions
        params["options"] = "-c search_path=retention_runner,public"
        return psycopg.connect(**params, autocommit=True)

    # -- workers ---------------------------------------------------------------------------
    def spawn(self, w: Worker) -> None:
        out = open(self.logdir / f"{w.name}.log", "a")  # noqa: SIM115 - owned by the process
        if w.kind == "qcluster":
            cmd = [sys.executable, "manage.py", "qcluster"]
            env = self.child_env(Q_CLUSTER_NAME="cleanup")
        else:
            cmd = [sys.executable, "manage.py", "retention", "drain", "--until-idle",
                   "--budget", "5"]  # fmt: skip
            env = self.child_env()
        w.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        w.starts += 1

    def start_workers(self) -> None:
        for i in range(self.args.qclusters):
            self.workers.append(Worker("qcluster", f"qcluster-{i}"))
        for i in range(self.args.drains):
            self.workers.append(Worker("drain", f"drain-{i}"))
        for w in self.workers:
            self.spawn(w)

    def stop_workers(self) -> None:
        for w in self.workers:
            if w.proc and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 40
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.killpg(w.proc)

    @staticmethod
    def killpg(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def supervise(self) -> None:
        """Respawn dead workers; judge clusters told to stop with SIGTERM."""
        now = time.monotonic()
        for w in self.workers:
            if w.terminating is not None:
                if w.proc.poll() is not None:
                    w.terminating.ok = True
                    w.terminating.note = f"exited by itself ({w.proc.returncode})"
                    w.terminating = None
                    self.killpg(w.proc)  # children, if any were left behind
                    w.respawn_at = now + self.rng.uniform(0.5, 2)
                elif now > w.term_deadline:
                    w.terminating.ok = False
                    w.terminating.note = f"did not exit within {SIGTERM_GRACE_S:.0f}s of SIGTERM"
                    self.problems.append(f"{w.name}: {w.terminating.note}")
                    w.terminating = None
                    self.killpg(w.proc)
                    w.respawn_at = now + 1
                continue
            if w.proc is not None and w.proc.poll() is None:
                continue
            if w.proc is not None and w.respawn_at == 0:
                # exited on its own (a drain loop with nothing to do, or a crash)
                if w.proc.returncode != 0:
                    self.actions[
                        f"{w.kind} exited with status {w.proc.returncode} (respawned)"
                    ] += 1
                w.respawn_at = now + (3.0 if w.kind == "drain" else 1.0)
            if now >= w.respawn_at:
                if w.proc is not None:
                    self.killpg(w.proc)
                self.spawn(w)
                w.respawn_at = 0.0

    def live(self, kind: str) -> list[Worker]:
        return [
            w
            for w in self.workers
            if w.kind == kind and w.terminating is None and w.proc and w.proc.poll() is None
        ]

    # -- data and policy ----------------------------------------------------------------------
    def create_table(self, ep: Epoch, rows: int, eligible: int, base_tick: datetime) -> None:
        """ids grow with time. Rows 1..eligible are older than every cutoff the soak can
        produce; the rest are younger than every one. Every 17th row is 'disputed' (kept),
        every 29th has a NULL status; tenant 1 holds about 40%."""
        from django.db import connection

        span_low = base_tick - timedelta(days=20, hours=MAX_SUPERSEDES + 2)
        old_start = span_low - timedelta(days=15)
        young_start = datetime.now(UTC) + timedelta(minutes=self.args_total_minutes() + 120)
        young_start -= timedelta(days=20)
        young_span = (datetime.now(UTC) - young_start).total_seconds()
        t = ep.table
        partitioned = self.args.partitioned
        # partitioned: kept rows ('disputed', and a NULL status, which a keep rule cannot
        # decide) only among the older half of the old rows, so the run can take the younger
        # half's daily partitions whole
        older = " AND g <= %(e)s / 2" if partitioned else ""
        disputed, no_status = f"g %% 17 = 0{older}", f"g %% 29 = 0{older}"
        with connection.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS public.{t}, public.{t}_shadow CASCADE")
            if partitioned:
                cur.execute(
                    f"""CREATE TABLE public.{t} (
                        id bigint NOT NULL, tenant_id int NOT NULL, occurred_at timestamptz NOT NULL,
                        status text, payload text, PRIMARY KEY (id, occurred_at))
                        PARTITION BY RANGE (occurred_at)"""
                )
                day = datetime(old_start.year, old_start.month, old_start.day, tzinfo=UTC)
                last = datetime.now(UTC) + timedelta(days=2)
                while day < last:
                    nxt = day + timedelta(days=1)
                    cur.execute(
                        f"CREATE TABLE public.{t}_{day:%Y%m%d} PARTITION OF public.{t}"
                        f" FOR VALUES FROM (%s) TO (%s)",
                        [day, nxt],
                    )
                    day = nxt
                cur.execute(f"CREATE TABLE public.{t}_default PARTITION OF public.{t} DEFAULT")
            else:
                cur.execute(
                    f"""CREATE TABLE public.{t} (
                        id bigint PRIMARY KEY, tenant_id int NOT NULL, occurred_at timestamptz NOT NULL,
                        status text, payload text)"""
                )
            cur.execute(
                f"""INSERT INTO public.{t}
                    SELECT g,
                           CASE WHEN g %% 5 < 2 THEN 1 ELSE 2 + (g %% 4) END,
                           CASE WHEN g <= %(e)s
                                THEN %(old)s::timestamptz + make_interval(secs => %(ospan)s * g::float8 / %(e)s)
                                ELSE %(young)s::timestamptz + make_interval(secs => %(yspan)s * (g - %(e)s)::float8 / (%(n)s - %(e)s + 1))
                           END,
                           CASE WHEN {disputed} THEN 'disputed' WHEN {no_status} THEN NULL ELSE 'closed' END,
                           repeat('x', 60)
                    FROM generate_series(1, %(n)s) AS g""",
                {
                    "e": eligible, "n": rows, "old": old_start, "young": young_start,
                    "ospan": (span_low - old_start).total_seconds() - 60, "yspan": young_span,
                },
            )  # fmt: skip
            cur.execute(f"CREATE INDEX ON public.{t} (tenant_id, id)")
            cur.execute(f"CREATE INDEX ON public.{t} (occurred_at)")
            cur.execute(f"CREATE TABLE public.{t}_shadow AS SELECT * FROM public.{t}")
            cur.execute(f"ANALYZE public.{t}")
            cur.execute(f"ANALYZE public.{t}_shadow")

    def args_total_minutes(self) -> float:
        return self.args.seconds / 60 + 30

    def users(self) -> None:
        from django.contrib.auth.models import Group, User

        for name, role in (
            ("soak-author", "compliance"),
            ("soak-approver", "compliance"),
            ("soak-oncall", "oncall"),
        ):
            user, _ = User.objects.get_or_create(username=name)
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        self.author = User.objects.get(username="soak-author")
        self.approver = User.objects.get(username="soak-approver")
        self.oncall = User.objects.get(username="soak-oncall")
        from core.tokens import create_token

        # the duplicate-trigger fault's CLI processes act as on-call with a personal token
        _, self.oncall_token = create_token(self.oncall, name="soak")

    def spec_fields(self, ep: Epoch, chunk_size: int) -> dict:
        return dict(
            slug=ep.slug, table=f"public.{ep.table}", key="id", timestamp="occurred_at",
            tenant="tenant_id", retention="20 days", schedule="0 * * * *", timezone="UTC",
            chunk_size=chunk_size, catch_up="none",
            keep=[{"column": "status", "op": "=", "value": "disputed"}],
            limits={"policy_workers": 3, "tenant_workers": 2},
            timeouts={"lock_ms": 500, "statement_ms": 1300},  # fits the 10 s task timeout
            guard={"probe_p95_ms": 400, "critical_probe_p95_ms": 100000,
                   "lock_waits": 8, "critical_lock_waits": 100000},
            pace_rows_per_s=self.pace,
        )  # fmt: skip

    def approve(self, ep: Epoch, chunk_size: int):
        from retention import actions
        from retention.models import PolicyVersion
        from retention.spec import PolicySpec

        spec = PolicySpec.parse(self.spec_fields(ep, chunk_size))
        version = actions.apply_spec(spec, author=self.author)
        if version.state == PolicyVersion.State.DRAFT:
            version = actions.submit_version(version, actor=self.author, reason="ready for review")
        return actions.approve_version(version, actor=self.approver, reason="soak")

    def new_epoch(self, n: int, rows: int, eligible: int) -> Epoch:
        from retention.models import Policy
        from retention.schedule_math import latest_tick
        from runs.actions import trigger_run

        ep = Epoch(n=n, table=f"soak_e{n}", slug=f"soak-e{n}")
        ep.base_tick = latest_tick(_Hourly, datetime.now(UTC)) - timedelta(hours=1)
        self.create_table(ep, rows, eligible, ep.base_tick)
        self.approve(ep, self.args.chunk_size)
        policy = Policy.objects.get(slug=ep.slug)
        ep.policy_id = policy.pk
        ep.ticks.append(ep.base_tick)
        run, _ = trigger_run(policy, tick=ep.base_tick, source="manual", actor=self.oncall)
        log(f"epoch {n}: {rows:,} rows ({eligible:,} old), run {run.run_key} {run.state}")
        self.epoch = ep
        self.epochs.append(ep)
        return ep

    # -- queries -----------------------------------------------------------------------------
    def runs(self, ep: Epoch):
        from runs.models import Run

        return list(Run.objects.filter(policy_id=ep.policy_id).order_by("created_at", "pk"))

    def newest_run(self, ep: Epoch):
        from runs.models import Run

        # a skipped run was folded into another run, which does its work: the newest of those
        return (
            Run.objects.filter(policy_id=ep.policy_id)
            .exclude(state=Run.State.SKIPPED)
            .select_related("policy", "policy_version")
            .order_by("-created_at", "-pk")
            .first()
        )

    def open_run(self, ep: Epoch):
        from runs.models import Run

        return (
            Run.objects.filter(policy_id=ep.policy_id, state=Run.State.ACTIVE)
            .select_related("policy", "policy_version")
            .first()
        )

    def audited_between(self, run_id: int, start: datetime, end: datetime) -> int:
        from runs.models import AuditRecord

        return AuditRecord.objects.filter(
            run_id=run_id, started_at__gt=start, started_at__lt=end
        ).count()

    # -- operator ---------------------------------------------------------------------------
    def run_pending(self, *, all_now: bool = False) -> None:
        now = time.monotonic()
        due = [p for p in self.pending if all_now or p[0] <= now]
        self.pending = [p for p in self.pending if p not in due]
        for _, _label, fn in sorted(due, key=lambda p: p[0]):
            self.db(fn)
        for item in list(self.verify_later):
            deadline, fault, predicate = item
            result = self.db(predicate)
            if result is not None:
                fault.ok, note = result
                fault.note += f"; {note}"
                if not fault.ok:
                    self.problems.append(f"{fault.kind}: {fault.note}")
                self.verify_later.remove(item)
            elif time.monotonic() > deadline:
                fault.ok = False
                fault.note += "; the old run did not stop in time"
                self.problems.append(f"{fault.kind}: {fault.note}")
                self.verify_later.remove(item)

    def operate(self) -> None:
        """What on-call does when a run needs a person: replay dead letters, resume a run that
        needs attention or a policy the guard paused, confirm a held run; and the reconciler."""
        from retention.actions import resume_policy
        from retention.models import Policy
        from runs.actions import ActionError, confirm_run, replay_dead_letter, resume_run
        from runs.engine.reconciler import reconcile
        from runs.models import DeadLetter, Run

        ep = self.epoch
        for letter in DeadLetter.objects.filter(
            run__policy_id=ep.policy_id, resolution=DeadLetter.Resolution.OPEN
        ):
            try:
                replay_dead_letter(letter, actor=self.oncall, reason="soak: replay")
                self.actions[f"replay dead letter ({letter.error_class} {letter.sqlstate})"] += 1
            except ActionError:
                pass
        for run in Run.objects.filter(policy_id=ep.policy_id, state=Run.State.ATTENTION):
            if not DeadLetter.objects.filter(run=run, resolution="open").exists():
                try:
                    resume_run(run, actor=self.oncall, reason="soak: resume after attention")
                    self.actions[f"resume run needing attention: {run.state_reason[:40]}"] += 1
                except ActionError:
                    pass
        for run in Run.objects.filter(policy_id=ep.policy_id, state=Run.State.CONFIRM):
            confirm_run(run, actor=self.oncall, reason="soak: confirm")
            self.actions["confirm run"] += 1
        policy = Policy.objects.get(pk=ep.policy_id)
        if policy.paused:
            resume_policy(policy, actor=self.oncall, reason="soak: resume after guard")
            self.actions[f"resume policy: {policy.paused_reason[:50]}"] += 1
        if time.monotonic() - getattr(self, "_last_reconcile", 0) > 4:
            reconcile()
            self._last_reconcile = time.monotonic()

    def invariant_check(self, ep: Epoch, *, final: bool = False) -> list[str]:
        """check_run for every run of the epoch in one snapshot, of the rows and of the catalog.

        PostgreSQL reads the catalog as it is now, not as the transaction's snapshot saw it: a
        partition detached, or dropped with its audit record, after the snapshot was taken
        would vanish from the table while the audit record stays out of the snapshot's sight
        ("3920 row(s) gone but 3360 audited"). So before the snapshot is taken (a LOCK takes
        none) the check locks the table against any change of its partitions (SHARE UPDATE
        EXCLUSIVE: a DETACH or ATTACH waits, a chunk's DELETE does not) and each detached
        partition a run is still finishing, or an operator kept, against its drop."""
        from django.db import ProgrammingError

        for attempt in range(5):
            try:
                return self._invariant_check(ep, final=final)
            except ProgrammingError as exc:
                # a detached partition dropped between the list and its lock: look again
                if "does not exist" not in str(exc) or attempt == 4:
                    raise
        return []

    def _invariant_check(self, ep: Epoch, *, final: bool) -> list[str]:
        from django.db import connection, transaction
        from psycopg import sql

        from runs.evidence.invariants import check_run
        from runs.models import PartitionAction, Run

        problems: list[str] = []
        newest = self.newest_run(ep)
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute(
                    sql.SQL("LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE")
                    .format(sql.Identifier("public", ep.table))
                    .as_string(cur.connection)
                )
                # listed on another session: a query here would take the snapshot
                with self.raw("soak-check") as other:
                    apart = other.execute(
                        sql.SQL(
                            "SELECT DISTINCT a.schema, a.name FROM {} a JOIN {} r ON r.id = a.run_id"
                            " WHERE r.policy_id = %s AND a.state = ANY(%s)"
                            " AND to_regclass(quote_ident(a.schema) || '.' || quote_ident(a.name))"
                            " IS NOT NULL"
                        ).format(
                            sql.Identifier(PartitionAction._meta.db_table),
                            sql.Identifier(Run._meta.db_table),
                        ),
                        [
                            ep.policy_id,
                            [PartitionAction.State.DETACHING, PartitionAction.State.KEPT],
                        ],
                    ).fetchall()
                for schema, name in apart:
                    cur.execute(
                        sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE")
                        .format(sql.Identifier(schema, name))
                        .as_string(cur.connection)
                    )
            for run in self.runs(ep):
                drained = final and (run.state == Run.State.DRAINED or run.pk == newest.pk)
                for p in check_run(run, shadow=("public", f"{ep.table}_shadow"),
                                   expect_drained=drained):  # fmt: skip
                    problems.append(f"{run.run_key} ({run.state}): {p}")
        return problems

    def mid_check(self) -> None:
        if self.active_holds:
            return  # rows deleted before a hold was placed would look "held and gone"
        problems = self.db(lambda: self.invariant_check(self.epoch))
        mark = [f for f in self.faults if not f.checked and f.epoch == self.epoch.n]
        if problems:
            for f in mark:
                f.ok = False
            self.problems.extend(f"mid-soak check: {p}" for p in problems)
            log(f"INVARIANT CHECK FAILED: {problems}")
        else:
            self.checks_passed += 1
        for f in mark:
            f.checked = True

    # -- the loop -----------------------------------------------------------------------------
    def uncovered(self, ep: Epoch, checks_before: int) -> list[str]:
        """What ``--until-covered`` still waits for in this epoch: fault kinds not injected
        yet, and a mid-soak invariant check when none has passed."""
        injected = {f.kind for f in self.faults if f.epoch == ep.n}
        missing = [kind for kind in self.args.until_covered if kind not in injected]
        if self.args.until_covered and self.checks_passed == checks_before:
            missing.append("a mid-soak invariant check")
        return missing

    def drive(self, ep: Epoch, until: float, restart_at: float | None) -> None:
        kinds, weights = zip(*FAULTS.items(), strict=True)
        since_check = 0
        checks_before = self.checks_passed
        # --until-covered: the phase goes on past ``until`` (at most twice as long again) until
        # every fault the caller asks about happened, instead of hoping a long phase has them
        cap = until + 2 * (until - time.monotonic())
        extended = False
        while time.monotonic() < until or (
            self.uncovered(ep, checks_before) and time.monotonic() < cap
        ):
            if time.monotonic() >= until and not extended:
                extended = True
                log(f"fault phase extended for {', '.join(self.uncovered(ep, checks_before))}")
            self.supervise()
            self.db(self.run_pending)
            self.db(self.operate)
            if restart_at is not None and time.monotonic() >= restart_at:
                self.pg_restart()
                restart_at = None
                continue
            kind = self.rng.choices(kinds, weights)[0]
            try:
                fault = self.db(lambda k=kind: self.inject(k))
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                log(f"could not inject {kind}: {exc!r}")
                self.actions[f"injection error ({kind})"] += 1
                fault = None
            if fault is not None:
                since_check += 1
            # past --seconds, still waiting for a mid-soak check (--until-covered): check now,
            # not after another --check-every faults that a busy machine injects slowly
            owed = (
                extended
                and since_check > 0
                and self.checks_passed == checks_before
                and not self.active_holds
            )
            if since_check >= self.args.check_every or owed:
                self.mid_check()
                if not self.active_holds:
                    since_check = 0
            time.sleep(self.rng.uniform(0.2, 2 * self.args.interval))

    def converge(self, ep: Epoch, timeout: float) -> None:
        """Stop injecting; finish what is pending; wait until every run of the epoch is terminal
        and the newest one drained; then check every run."""
        from runs.models import Run

        log(f"epoch {ep.n}: converging")
        self.db(lambda: self.run_pending(all_now=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.supervise()
            self.db(lambda: self.run_pending(all_now=True))
            self.db(self.operate)
            states = self.db(lambda: [r.state for r in self.runs(ep)])
            newest = self.db(lambda: self.newest_run(ep))
            if (
                newest.state == Run.State.DRAINED
                and all(s in Run.TERMINAL for s in states)
                and not self.verify_later
            ):
                ep.converged = True
                break
            time.sleep(1)
        if not ep.converged:
            states = self.db(lambda: {r.run_key: (r.state, r.state_reason) for r in self.runs(ep)})
            ep.problems.append(f"did not converge within {timeout:.0f}s: {states}")
        problems = self.db(lambda: self.invariant_check(ep, final=True))
        ep.problems.extend(problems)
        if not problems:
            self.checks_passed += 1
        ep.runs = self.db(lambda: {r.run_key: r.state for r in self.runs(ep)})
        from runs.models import AuditRecord

        ep.rows_deleted = self.db(
            lambda: sum(
                AuditRecord.objects.filter(policy_slug=ep.slug).values_list(
                    "rows_deleted", flat=True
                )
            )
        )
        for f in self.faults:
            if f.epoch == ep.n:
                f.checked = f.checked or not problems
        self.problems.extend(f"epoch {ep.n}: {p}" for p in ep.problems)
        log(
            f"epoch {ep.n}: converged={ep.converged}, {ep.rows_deleted:,} rows deleted, "
            f"runs {ep.runs}, problems {len(ep.problems)}"
        )

    def main(self) -> int:
        t_start = time.monotonic()
        self.start_database()
        self.db(self.users)
        self.pace = self.args.pace
        self.start_workers()
        total = self.args.seconds
        long_mode = total > 400
        epoch_s = self.args.epoch_seconds if long_mode else total
        restart_every = self.args.restart_every if long_mode else None
        next_restart = t_start + (restart_every or total * 0.45)
        if self.args.until_covered:
            # the restart falls 45% into the (short) fault phase, whatever the set-up took
            next_restart = time.monotonic() + total * 0.45
        end = time.monotonic() + total
        n = 0
        try:
            while True:
                n += 1
                remaining = end - time.monotonic()
                ep_s = min(epoch_s, remaining)
                eligible = int(self.pace * ep_s * self.args.fill)
                rows = int(eligible * 1.6)
                ep = self.db(lambda n=n, r=rows, e=eligible: self.new_epoch(n, r, e))
                ep.eligible = eligible
                until = time.monotonic() + ep_s
                restart_at = next_restart if next_restart < until else None
                if restart_at is not None:
                    next_restart = restart_at + restart_every if restart_every else float("inf")
                self.drive(ep, until, restart_at)
                self.converge(ep, self.args.converge_seconds)
                if time.monotonic() > end - 30 or not long_mode:
                    break
            final = self.final_checks()
        finally:
            self.stop_workers()
        from django.db.models import Count

        from runs.models import AuditRecord, Run

        states = dict(
            Run.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
        )
        rows = self.table()
        report = {
            "minutes": (time.monotonic() - t_start) / 60,
            "seed": self.args.seed,
            "epochs": [
                {
                    "n": e.n,
                    "converged": e.converged,
                    "rows_deleted": e.rows_deleted,
                    "runs": e.runs,
                    "problems": e.problems,
                    "supersedes": e.supersedes,
                }
                for e in self.epochs
            ],  # fmt: skip
            "faults": rows,
            "injected": sum(r["injected"] for r in rows),
            "survived": sum(r["survived"] for r in rows),
            "rows_deleted": sum(AuditRecord.objects.values_list("rows_deleted", flat=True)),
            "partitions_dropped": AuditRecord.objects.filter(outcome="dropped").count(),
            "runs": sum(states.values()),
            "run_states": ", ".join(f"{k} {v}" for k, v in sorted(states.items())),
            "invariant_checks_passed": self.checks_passed,
            "operator_actions": dict(self.actions),
            "worker_starts": sum(w.starts for w in self.workers),
            "problems": self.problems,
            "passed": not self.problems,
            **final,
        }
        text = self.render(rows, report)
        report["table"] = text
        print(text, flush=True)
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(report, indent=2, default=str))
        return 0 if report["passed"] else 1


class _Hourly:
    schedule, timezone = "0 * * * *", "UTC"
