"""Chart data and SVG geometry for the run page: the rows/s series and bar rectangles.

Only shapes to draw; the figures a person reads (rows, percent, ETA) come from
``runs.progress``.
"""

from __future__ import annotations

import math

from django.db import connection

from runs.models import Chunk, Run

CHART_BUCKETS = 60


def rate_series(run: Run, buckets: int = CHART_BUCKETS, *, span=None) -> dict:
    """Rows deleted per time bucket (at most ``buckets`` buckets of at least one second) between
    the first and the last commit.

    ``span`` is ``(first_commit, last_commit)`` as the caller's ``progress_for`` read them: the
    chart is then one grouped scan of the run's audit rows up to that last commit (a row
    committed after the reading is left for the next refresh, so the chart and the figures
    beside it describe the same moment). Without it, the span is read first."""
    if span is None:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT min(committed_at), max(committed_at) FROM runs_auditrecord"
                " WHERE run_id = %s",
                [run.pk],
            )
            span = cur.fetchone()
    lo, hi = span
    out = {"points": [], "lo": None, "hi": None, "bucket_s": 0.0, "peak": 0.0}
    if lo is None or hi is None:
        return out
    width = max((hi - lo).total_seconds() / buckets, 1.0)
    sql = """
        SELECT least(floor(extract(epoch FROM committed_at - %(lo)s) / %(w)s)::int,
                     %(n)s - 1) AS bucket,
               sum(rows_deleted)::float8, count(*)
        FROM runs_auditrecord
        WHERE run_id = %(run)s AND committed_at <= %(hi)s
        GROUP BY bucket
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"run": run.pk, "n": buckets, "lo": lo, "hi": hi, "w": width})
        rows = cur.fetchall()
    by_bucket = {bucket: (float(deleted), int(n)) for bucket, deleted, n in rows}
    used = min(buckets, int((hi - lo).total_seconds() // width) + 1)
    for b in range(used):
        deleted, n = by_bucket.get(b, (0.0, 0))
        out["points"].append({"bucket": b, "rate": deleted / width, "chunks": n})
    out.update(lo=lo, hi=hi, bucket_s=width, peak=max(pt["rate"] for pt in out["points"]))
    return out


def svg_bars(values: list[float], *, width: int = 600, height: int = 140) -> list[dict]:
    """Rectangles for a bar chart of ``values`` scaled to the tallest one."""
    if not values:
        return []
    values = [float(v) for v in values]
    peak = max(values) or 1.0
    step = width / len(values)
    bars = []
    for i, value in enumerate(values):
        h = round(height * value / peak, 1)
        bars.append(
            {"x": round(i * step, 1), "y": round(height - h, 1), "w": max(1, step - 1), "h": h}
        )
    return bars


def state_histogram(chunks: dict[str, int]) -> list[dict]:
    """Bars for the chunk-state histogram (split last: its children are counted too)."""
    states = [s for s in Chunk.State.values if s != Chunk.State.SPLIT] + [Chunk.State.SPLIT]
    counts = [chunks.get(s, 0) for s in states]
    bars = svg_bars(counts, width=400, height=100)
    return [
        {"state": s, "count": c, "bar": b} for s, c, b in zip(states, counts, bars, strict=True)
    ]


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^n at or above ``value`` (an axis maximum)."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        top = step * 10**exp
        if top >= value:
            return float(top)
    return float(10 ** (exp + 1))


def rate_chart(rates: dict, *, pace: int = 0, width: int = 600, height: int = 140) -> dict:
    """The rows/s chart: bars on a y-axis from 0 to a round maximum at or above both the peak
    and the policy's pace (``pace_rows_per_s``, 0 = none), four ticks, and the pace line.

    The pace is kept on average over each chunk and the wait after it (``worker._pace``): a
    chunk's rows commit at once, so a bucket shorter than a chunk and its wait can show more
    than the pace. ``over_pace`` says a bucket does, so the page can say why."""
    values = [float(pt["rate"]) for pt in rates.get("points", [])]
    if not values:
        return {"bars": [], "ticks": [], "pace": None, "over_pace": False}
    top = _nice_ceiling(max(max(values), float(pace or 0)))
    step = width / len(values)
    bars = []
    for i, value in enumerate(values):
        h = round(height * value / top, 1)
        bars.append(
            {"x": round(i * step, 1), "y": round(height - h, 1), "w": max(1, step - 1), "h": h}
        )
    ticks = [{"value": top * k / 4, "y": round(height - height * k / 4, 1)} for k in range(0, 5)]
    line = None
    if pace:
        line = {"value": int(pace), "y": round(height - height * pace / top, 1)}
    return {
        "bars": bars,
        "ticks": ticks,
        "pace": line,
        "over_pace": bool(pace) and max(values) > pace,
        "top": top,
    }
