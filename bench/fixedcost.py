"""The run's fixed costs on one table, with the plans that show them
(``python -m bench.fixedcost TABLE [--workers N]``, DATABASE_URL pointing at the bench
database, the table in schema ``bench`` with the bench's layout: ``bench/dataset.py``).

Approves a policy on the table (``bench.product``), then prints ``EXPLAIN (ANALYZE, BUFFERS)``
of the run's eligible-key bounds, exact (``RETENTION_BOUND_ESTIMATE_ROWS=0``, the statement
before the estimate) and estimated; drains the run with ``--workers`` workers in this process
(``manage.py retention drain``), timing release → first chunk, the chunks and last chunk →
drained from the audit ledger; then the plans of the verification over the whole old range
(the statement before) and over what the run may have missed (``reconciler.missed_count``),
on the drained table — without and with the read above the last key that the drain took
beside its chunks (``reconciler.read_above``, whose statement is explained on the fresh table
before the drain). Nothing is timed in tests; this prints.
"""

from __future__ import annotations

import io
import json
import sys
import time
from datetime import UTC, datetime

from bench import dataset
from bench.product import _approve, _django

RETENTION = f"{dataset.RETENTION_DAYS} days"


def _explain(frag, *, scans=None) -> str:
    from runs.engine.explain import _plan

    return "\n".join(_plan(frag, scans=scans))


def main() -> None:
    table = sys.argv[1]
    workers = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 2
    _django()
    from django.core.management import call_command
    from django.db import connection

    from retention import cascades
    from retention import predicate as P
    from runs.actions import trigger_run
    from runs.engine import planner, reconciler
    from runs.models import AuditRecord, PlannerCursor, discarded_scopes

    now = datetime.now(UTC)
    tick = now.replace(hour=0, minute=0, second=0, microsecond=0)
    slug = f"fc-{table.replace('_', '-')}-{int(time.time()) % 100000}"
    policy = _approve(
        {
            "slug": slug, "table": table, "retention": RETENTION, "chunk_size": 5000,
            "target_chunk_ms": 300, "workers": workers,
        }
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=tick, source="manual", actor="scheduler")
    spec = run.policy_version.parsed
    columns = run.bound_columns(spec)
    print(f"# {table}: run {run.run_key}, chunking {run.chunking} ({run.chunking_reason})")
    exact = planner.bounds_query(run.policy_id, run.cutoff, spec, columns=columns)
    estimate = planner.bounds_query(
        run.policy_id, run.cutoff, spec, columns=columns, estimate=10_000
    )
    for title, frag in (("bounds, exact (before)", exact), ("bounds, estimated (after)", estimate)):
        with connection.cursor() as cur:
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            found = cur.fetchone()
        print(f"\n== planner: eligible key bounds, {title}: {found}\n{_explain(frag)}")
    if reconciler.reads_above_early(run, spec) and found[1] is not None:
        top, above = reconciler.above_queries(
            run, spec, tuple(found[1]), types=P.column_types(spec)
        )
        print(f"\n== reconciler: the read above the last key, on the fresh table\n{_explain(top)}")
        print(_explain(above, scans=lambda: reconciler.bitmap_scan(spec)))
    released = time.time()
    out = io.StringIO()
    call_command(
        "retention", "drain", run.run_key, "--until-idle", "--workers", str(workers), stdout=out
    )
    ended = time.time()
    run.refresh_from_db()
    ledger = list(
        AuditRecord.objects.filter(run=run)
        .order_by("started_at")
        .values_list("started_at", "committed_at")
    )
    facts = {
        "state": run.state, "passes": run.pass_no, "wall_s": round(ended - released, 2),
        "release_to_first_chunk_s": round(ledger[0][0].timestamp() - released, 2),
        "chunk_span_s": round(ledger[-1][1].timestamp() - ledger[0][0].timestamp(), 2),
        "last_commit_to_end_s": round(ended - ledger[-1][1].timestamp(), 2),
        "chunks": len(ledger), "verification": run.verification, "output": out.getvalue().strip(),
    }  # fmt: skip
    print("\n# drained:", json.dumps(facts, default=str, indent=1))
    types = P.column_types(spec)
    _graph, cascade = cascades.for_run(spec, policy_id=run.policy_id, cutoff=run.cutoff, tick=tick)
    full = P.verification_counts(
        spec, policy_id=run.policy_id, cutoff=run.cutoff, outside=discarded_scopes(run),
        limit=100_000, types=types, cascade=cascade,
    )  # fmt: skip
    print(
        "\n== reconciler: verification over the whole old range (before)\n"
        + _explain(full, scans=lambda: reconciler.bitmap_scan(spec))
    )
    ranges = reconciler.missed_ranges(run, spec, types=types, cascade=cascade)
    if ranges is None:
        print("\n(the run's verification reads the whole old range: missed_ranges is None)")
        return
    narrow = reconciler.missed_count(
        run, spec, *ranges, outside=discarded_scopes(run), limit=100_000, types=types
    )
    print(
        f"\n== reconciler: verification of what the run may have missed, {ranges}\n"
        + _explain(narrow, scans=lambda: reconciler.bitmap_scan(spec))
    )
    record = PlannerCursor.objects.filter(run=run, pass_no=run.pass_no, tenant="").first()
    if record is None or not record.read_above or record.read_above.get("found") is None:
        print("\n(no read above the last key was taken beside the chunks)")
        return
    early = record.read_above
    narrow = reconciler.missed_count(
        run, spec, *ranges, outside=discarded_scopes(run), limit=100_000, types=types, early=early
    )
    print(
        f"\n== reconciler: the same, with the read above the last key taken beside the chunks,"
        f" {early}\n" + _explain(narrow, scans=lambda: reconciler.bitmap_scan(spec))
    )


def summary(path: str) -> str:
    """One line per shape of a matrix results JSON (``bench/run.py --shapes``): the product with
    1 and 2 workers, guard off and on, against the key-range loop; 2 workers ÷ 1; the
    foreground under each 2-worker contender against its idle baseline; where each product
    run's wall went (``phases``: release → first chunk, last chunk → the worker's exit)."""
    data = json.loads(open(path).read())  # noqa: SIM115 - a short read
    names = ("product-1w", "product-1w-guard", "product-2w", "product-2w-guard")
    lines = [
        "| shape | key-range rows/s | 1w | 1w guard | 2w | 2w guard | 2w ÷ 1w | 2w guard ÷ 1w guard"
        " | fg p99 × idle: 2w / 2w guard | fg max ms: 2w / 2w guard"
        " | before first chunk / after last, s (1w, 2w) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key in data["datasets"]:
        runs = {r["contender"]: r for r in data["runs"] if r.get("dataset") == key}
        loop = runs.get("keyrange", {}).get("rows_per_s")
        idle = data["idle"].get(key, {}).get("p99")

        def rate(name, runs=runs):
            return (runs.get(name) or {}).get("rows_per_s")

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "–"

        def fg(name, field, runs=runs):
            return ((runs.get(name) or {}).get("foreground") or {}).get(field)

        def phase(name, runs=runs):
            p = (runs.get(name) or {}).get("phases") or {}
            return f"{p.get('release_to_first_chunk_s', 0):.2f} / {p.get('last_commit_to_end_s', 0):.2f}"

        lines.append(
            f"| {key} | {loop or 0:,.0f} | "
            + " | ".join(f"{ratio(rate(n), loop)}×" for n in names)
            + f" | {ratio(rate('product-2w'), rate('product-1w'))}"
            + f" | {ratio(rate('product-2w-guard'), rate('product-1w-guard'))}"
            + f" | {ratio(fg('product-2w', 'p99'), idle)} / {ratio(fg('product-2w-guard', 'p99'), idle)}"
            + f" | {fg('product-2w', 'max') or 0:.0f} / {fg('product-2w-guard', 'max') or 0:.0f}"
            + f" | {phase('product-1w')}, {phase('product-2w')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        print(summary(sys.argv[2]))
    else:
        main()
