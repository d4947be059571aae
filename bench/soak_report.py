"""The chaos soak's report: the final checks, the table fault kind → injected / survived, and
its text (a mixin of ``bench.soak.Soak``)."""

from __future__ import annotations

import time
from collections import defaultdict

from bench.soak_faults import ALL_KINDS


class Report:
    def final_checks(self) -> dict:
        """The audit chain; no session of the product left idle in a transaction; the queue
        settles (nothing stays dequeued and unacknowledged)."""
        from runs.evidence.audit import verify_chain

        chain = self.db(verify_chain)
        if not chain.ok:
            self.problems.extend(f"audit chain: {p}" for p in chain.problems)
        settle = time.monotonic() + 40
        stuck = idle = None
        while time.monotonic() < settle:
            self.supervise()
            with self.raw() as conn:
                idle = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE 'retention:%%' AND state LIKE 'idle in transaction%%'"
                    " AND xact_start < now() - interval '20 seconds'"
                ).fetchone()[0]
                stuck = conn.execute(
                    "SELECT count(*) FROM django_q_ormq WHERE lock < now() - interval '60 seconds'"
                ).fetchone()[0]
            if not idle and not stuck:
                break
            time.sleep(2)
        if idle:
            self.problems.append(f"{idle} product session(s) idle in a transaction for > 20 s")
        if stuck:
            self.problems.append(f"{stuck} queue message(s) dequeued and never acknowledged")
        return {
            "audit_records": chain.records,
            "idle_in_transaction": idle,
            "stuck_messages": stuck,
        }

    # -- report --------------------------------------------------------------------------------
    def table(self) -> list[dict]:
        rows = []
        by_kind = defaultdict(list)
        for f in self.faults:
            by_kind[f.kind].append(f)
        converged = {ep.n for ep in self.epochs if ep.converged and not ep.problems}
        for kind in ALL_KINDS:
            fs = by_kind.get(kind, [])
            survived = [f for f in fs if f.ok is not False and f.checked and f.epoch in converged]
            failed_notes = [f.note for f in fs if f not in survived][:3]
            rows.append(
                {"fault": kind, "injected": len(fs), "survived": len(survived),
                 "failed": failed_notes}
            )  # fmt: skip
        return rows

    def render(self, rows: list[dict], report: dict) -> str:
        lines = [
            "| fault | injected | survived |",
            "|---|---:|---:|",
            *(f"| {r['fault']} | {r['injected']} | {r['survived']} |" for r in rows),
            f"| **total** | **{sum(r['injected'] for r in rows)}** | "
            f"**{sum(r['survived'] for r in rows)}** |",
            "",
            f"{report['minutes']:.1f} min, {len(self.epochs)} epoch(s), "
            f"{report['rows_deleted']:,} rows deleted in {report['audit_records']:,} audited "
            f"chunks, {report['runs']} run(s) ({report['run_states']}), "
            f"{self.checks_passed} invariant checks passed, worker (re)starts "
            f"{report['worker_starts']}.",
        ]
        if self.actions:
            lines.append(
                "Operator actions to converge: "
                + ", ".join(f"{k} × {v}" for k, v in sorted(self.actions.items()))
                + "."
            )
        lines.append("Result: " + ("PASS" if not self.problems else "FAIL"))
        for p in self.problems[:30]:
            lines.append(f"- {p}")
        return "\n".join(lines)
