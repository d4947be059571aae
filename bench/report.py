"""Tables, target checks and the chart of a benchmark run (``bench/run.py`` results)."""

from __future__ import annotations

import shutil
import subprocess
from html import escape
from pathlib import Path


def _f(value, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float | int):
        return f"{value:,.{digits}f}{suffix}"
    return str(value)


def _by(data: dict, dataset: str) -> dict:
    return {r["contender"]: r for r in data["runs"] if r["dataset"] == dataset}


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def main_table(data: dict, dataset: str) -> list[str]:
    runs = _by(data, dataset)
    idle = data["idle"].get(dataset, {})
    single = runs.get("single", {})
    out = [
        "| contender | rows deleted | wall s | rows/s | × single | WAL B/row (× single) | rows/chunk | chunk p50 / p99 ms"
        " | flatness | overhead p50 ms | fg p50 / p95 / p99 / max ms | fg p99 × idle | worker RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        f"| *no cleanup (idle baseline)* | | | | | | | | | | {_f(idle.get('p50'), 1)} / {_f(idle.get('p95'), 1)}"
        f" / {_f(idle.get('p99'), 1)} / {_f(idle.get('max'), 1)} | 1.00 | |",
    ]
    for name, r in runs.items():
        c, fg = r["chunks"], r["foreground"]
        label = r["label"] + (" (stopped at time cap)" if r.get("capped") else "")
        out.append(
            f"| {label} | {_f(r['rows'])} | {_f(r['wall_s'], 2)} | {_f(r['rows_per_s'])}"
            f" | {_f(_ratio(r['rows_per_s'], single.get('rows_per_s')), 2)}"
            f" | {_f(r['wal_per_row'], 0)} ({_f(_ratio(r['wal_per_row'], single.get('wal_per_row')), 2)})"
            f" | {_f(c.get('rows_mean'))} | {_f(c.get('p50_ms'), 1)} / {_f(c.get('p99_ms'), 1)}"
            f" | {_f(c.get('flatness'), 2)}"
            f" | {_f(c.get('overhead_p50_ms'), 2) if name != 'single' else '–'}"
            f" | {_f(fg.get('p50'), 1)} / {_f(fg.get('p95'), 1)} / {_f(fg.get('p99'), 1)} / {_f(fg.get('max'), 1)}"
            f" | {_f(_ratio(fg.get('p99'), idle.get('p99')), 2)} | {_f(r['worker_rss_kb'] / 1024, 0)} |"
        )
    return out


def guard_table(data: dict, dataset: str) -> list[str]:
    """Issue 5's view: foreground latency and drain rate without cleanup, unguarded, guarded."""
    runs = _by(data, dataset)
    idle = data["idle"].get(dataset, {})
    rows = [("no cleanup", idle, None)]
    for name, label in (
        ("product-2w", "cleanup, guard off"),
        ("product-2w-guard", "cleanup, guard on"),
    ):
        if name in runs:
            rows.append((label, runs[name]["foreground"], runs[name]["rows_per_s"]))
    out = [
        "| foreground during | p50 ms | p99 ms | max ms | ops > 50 ms | drain rows/s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for label, fg, rate in rows:
        out.append(
            f"| {label} | {_f(fg.get('p50'), 1)} | {_f(fg.get('p99'), 1)} | {_f(fg.get('max'), 1)}"
            f" | {_f(fg.get('over_50ms'))} of {_f(fg.get('n'))} | {_f(rate)} |"
        )
    return out


def scale_table(data: dict) -> list[str]:
    out = [
        "| dataset | contender | approve (preview) s | trigger (eligible count) s | first plan window s"
        " | planner process RSS MB | worker peak RSS MB |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in data["runs"]:
        s = r.get("setup")
        if not s or not r["dataset"].startswith("base/"):
            continue
        first = (
            f"{_f(s['plan_s'], 3)} ({s['planned']} chunks)" if "plan_s" in s else "by the workers"
        )
        out.append(
            f"| {r['dataset']} | {r['contender']} | {_f(s['approve_s'], 2)} | {_f(s['trigger_s'], 2)}"
            f" | {first} | {_f(s['rss_kb'] / 1024, 0)}"
            f" | {_f(r['worker_rss_kb'] / 1024, 0)} |"
        )
    return out


def variant_table(data: dict) -> list[str]:
    out = [
        "| dataset | contender | rows/s | × single | WAL B/row (× single) | chunk p99 ms | fg p99 ms | check |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for key in data["datasets"]:
        if key.startswith("base/"):
            continue
        runs = _by(data, key)
        single = runs.get("single", {})
        for r in runs.values():
            check = f"{r['remaining_eligible']} eligible left"
            if "orphans" in r:
                check += f", {r['orphans']} orphan children"
            out.append(
                f"| {key} | {r['label']} | {_f(r['rows_per_s'])} | {_f(_ratio(r['rows_per_s'], single.get('rows_per_s')), 2)}"
                f" | {_f(r['wal_per_row'], 0)} ({_f(_ratio(r['wal_per_row'], single.get('wal_per_row')), 2)})"
                f" | {_f(r['chunks'].get('p99_ms'), 1)} | {_f(r['foreground'].get('p99'), 1)} | {check} |"
            )
    return out


def targets(data: dict, dataset: str) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, ratio/threshold, met) for the issue's targets on ``dataset``."""
    runs = _by(data, dataset)
    idle = data["idle"].get(dataset, {})
    single = runs.get("single", {}).get("rows_per_s")
    p2, pg = runs.get("product-2w"), runs.get("product-2w-guard")
    out: list = []

    def add(name, value, limit, ok_if_ge: bool, fmt="{:.2f}"):
        if value is None:
            out.append((name, "not measured", "", None))
            return
        met = value >= limit if ok_if_ge else value <= limit
        out.append((name, fmt.format(value), ("≥ " if ok_if_ge else "≤ ") + fmt.format(limit), met))

    if p2:
        add(
            "guard off, 2 workers: rows/s ÷ single DELETE",
            _ratio(p2["rows_per_s"], single),
            0.70,
            True,
        )
        add("guard off, 2 workers: rows/s ÷ key-range loop",
            _ratio(p2["rows_per_s"], runs.get("keyrange", {}).get("rows_per_s")), 1.0, True)  # fmt: skip
        add("guard off, 2 workers: rows/s ÷ naive loop",
            _ratio(p2["rows_per_s"], runs.get("naive", {}).get("rows_per_s")), 3.0, True)  # fmt: skip
        add(
            "chunk duration flatness (last 10% ÷ first 10%), 2 workers",
            p2["chunks"].get("flatness"),
            1.2,
            False,
        )
        add("WAL bytes per row ÷ single DELETE, 2 workers",
            _ratio(p2["wal_per_row"], runs.get("single", {}).get("wal_per_row")), 1.3, False)  # fmt: skip
        add(
            "per-chunk overhead median, 2 workers (ms)",
            p2["chunks"].get("overhead_p50_ms"),
            5.0,
            False,
        )
    if pg:
        add("guard on: rows/s ÷ single DELETE", _ratio(pg["rows_per_s"], single), 0.50, True)
        add(
            "guard on: foreground p99 ÷ idle p99",
            _ratio(pg["foreground"].get("p99"), idle.get("p99")),
            1.3,
            False,
        )
        add("guard on: longest chunk (ms)", pg["chunks"].get("max_ms"), 1000.0, False, "{:.0f}")
        add(
            "guard on: max foreground stall (ms)",
            pg["foreground"].get("max"),
            50.0,
            False,
            "{:.1f}",
        )
    sizes = [k for k in data["datasets"] if k.startswith("base/")]
    if len(sizes) >= 2:
        small, large = _by(data, sizes[0]).get("product-2w"), _by(data, sizes[-1]).get("product-2w")
        if small and large:
            add(f"planner/worker memory {sizes[-1]} ÷ {sizes[0]}",
                _ratio(large["worker_rss_kb"], small["worker_rss_kb"]), 1.1, False)  # fmt: skip
    return out


def matrix_table(data: dict, size: str) -> list[str]:
    """The shape matrix at one size: every shape × contender, ratios within the shape."""
    out = [
        "| shape | contender | rows/s | × single | × key-range | WAL B/row | fg p50 / p99 / max ms"
        " | fg p99 × idle |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for key in data["datasets"]:
        shape, _, label = key.partition("/")
        if label != size:
            continue
        runs = _by(data, key)
        idle = data["idle"].get(key, {})
        single = runs.get("single", {}).get("rows_per_s")
        keyrange = runs.get("keyrange", {}).get("rows_per_s")
        out.append(
            f"| {shape} | *idle (no cleanup)* | | | | | {_f(idle.get('p50'), 1)} / {_f(idle.get('p99'), 1)}"
            f" / {_f(idle.get('max'), 1)} | 1.00 |"
        )
        for name, r in runs.items():
            label = _SHORT.get(name, name)
            if r.get("refused"):
                out.append(f"| {shape} | {label} | refused: {r['refused']} | | | | | |")
                continue
            fg = r["foreground"]
            note = " (time cap)" if r.get("capped") else ""
            if r.get("remaining_eligible") and not r.get("capped"):
                note += f" ({r['remaining_eligible']:,} eligible left: {r.get('run_state', '')})"
            out.append(
                f"| {shape} | {label}{note} | {_f(r['rows_per_s'])}"
                f" | {_f(_ratio(r['rows_per_s'], single), 2)} | {_f(_ratio(r['rows_per_s'], keyrange), 2)}"
                f" | {_f(r['wal_per_row'], 0)}"
                f" | {_f(fg.get('p50'), 1)} / {_f(fg.get('p99'), 1)} / {_f(fg.get('max'), 1)}"
                f" | {_f(_ratio(fg.get('p99'), idle.get('p99')), 2)} |"
            )
    return out


_SHORT = {
    "single": "single DELETE",
    "naive": "naive loop",
    "keyrange": "key-range loop",
    "keyrange-2": "key-range loop, 2 connections",
    "product-1w": "product 1w",
    "product-2w": "product 2w",
    "product-2w-guard": "product 2w guard",
    "product-1w-guard": "product 1w guard",
    "product-2w-guard-sparse": "product 2w guard, no probes between samples",
    "product-2w-guard-nothread": "product 2w guard, samples by the admissions alone",
    "product-2w-nice": "product 2w, workers at nice 10",
    "product-2w-guard-nice": "product 2w guard, workers at nice 10",
}


def _repeats(data: dict) -> str:
    """How many runs each figure stands for, per size."""
    per_size: dict[str, int] = {}
    for run in data["runs"]:
        size = run.get("dataset", "/").partition("/")[2]
        per_size[size] = max(per_size.get(size, 1), len(run.get("repeats") or [run]))
    if all(n == 1 for n in per_size.values()):
        return "one run each"
    return "; ".join(
        f"{size}: median of {n} runs each (by rate), in turns" if n > 1 else f"{size}: one run each"
        for size, n in per_size.items()
    )


def matrix_markdown(data: dict) -> str:
    m = data["machine"]
    sizes = list(dict.fromkeys(k.partition("/")[2] for k in data["datasets"]))
    load = [f"{k} {v[0]} → {v[-1]}" for k, v in data.get("load", {}).items() if v]
    lines = [
        f"Shape matrix, {data['started_at']}, commit {data.get('commit', '?')} — {m.get('cpus')} CPUs"
        f" ({m.get('cpu', '')}), {m.get('mem_gb')} GB, PostgreSQL {data['server']}; chunk size"
        f" {data['chunk_size']}, foreground {data['rate']:.0f} ops/s; total {data['total_s']:.0f} s;"
        f" contenders one at a time; {_repeats(data)}.",
        "",
        "Load average (1/5/15 min) at each shape's start → end: " + "; ".join(load) + ".",
        "",
    ]
    for size in sizes:
        lines += [f"#### Shapes at {size} rows", "", *matrix_table(data, size), ""]
    lines += ["Shapes (and the chunk geometry the product's run chose, with its reason):", ""]
    for key, facts in data["datasets"].items():
        chosen = _geometry(data, key)
        lines.append(
            f"- `{key}`: {facts.get('meaning', '')}; {facts['eligible']:,} of {facts['rows']:,} eligible"
            + (f"; product: {chosen}" if chosen else "")
        )
    for size in sizes:
        lines += ["", f"Targets at {size} rows:", "", *matrix_targets(data, size)]
    waited = overlap_table(data)
    if waited:
        lines += [
            "",
            "Where the foreground waited: its requests split by whether they started while a"
            " chunk transaction was in flight (× idle: against the idle p99 of the same shape):",
            "",
            *waited,
        ]
    steps = controller_table(data)
    if steps:
        lines += [
            "",
            "The guard controller's own report (its recorded steps during each guarded run):",
            "",
        ]
        lines += steps
    return "\n".join(lines) + "\n"


def _kinds(part: dict) -> str:
    """A part's p99 per request kind (read / tenant / insert), "–" for one it has none of."""
    by = part.get("p99_by_kind") or {}
    return " / ".join(
        _f(by.get(k), 1) if by.get(k) is not None else "–" for k in ("read", "tenant", "insert")
    )


def overlap_table(data: dict) -> list[str]:
    """Per run with chunk times: the share of foreground requests that overlapped a chunk
    transaction, their p99 and the p99 of the others, each also × the idle p99."""
    rows = []
    for r in data["runs"]:
        fg = r.get("foreground") or {}
        during, between = fg.get("during_chunks"), fg.get("between_chunks")
        if not during or not between:
            continue
        idle = data["idle"].get(r["dataset"], {}).get("p99")
        n = during["n"] + between["n"]
        probe = r.get("probe") or {}
        seen = (
            f"{_f(probe.get('p99'), 1)} ({_f(_ratio(probe.get('p99'), probe.get('idle')), 2)}"
            f" × its idle p{probe.get('idle_rank') or '–'} {_f(probe.get('idle'), 1)};"
            f" {probe.get('n', 0)} readings)"
            if probe
            else "–"
        )
        rows.append(
            f"| {r['dataset']} | {_SHORT.get(r['contender'], r['contender'])}"
            f" | {_f(fg.get('p99'), 1)} ({_f(_ratio(fg.get('p99'), idle), 2)})"
            f" | {_f(100 * during['n'] / n if n else None, 0)}%"
            f" | {_f(during['p99'], 1)} ({_f(_ratio(during['p99'], idle), 2)})"
            f" | {_f(between['p99'], 1)} ({_f(_ratio(between['p99'], idle), 2)})"
            f" | {_kinds(during)} | {_kinds(between)} | {seen}"
            f" | {_f(r.get('xacts_per_chunk'), 1)} |"
        )
    if not rows:
        return []
    return [
        "| shape | contender | fg p99 ms (× idle) | requests during chunks"
        " | p99 during chunks ms (× idle) | p99 between chunks ms (× idle)"
        " | during: read / tenant / insert p99 ms | between: read / tenant / insert p99 ms"
        " | the guard's probe over the run: p99 ms | product transactions per chunk |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        *rows,
    ]


def controller_table(data: dict) -> list[str]:
    """Per guarded product run: the controller's steps by action, its settings after the last
    step, the highest inflation it measured against its budget, and its last reason (when it
    could not meet the budget at its minimum setting, that reason says so)."""
    rows = []
    for r in data["runs"]:
        steps = r.get("controller")
        if steps is None:
            continue
        key = r["dataset"]
        if not steps:
            rows.append(
                f"| {key} | {r['contender']} | no step (the run ended first) | – | – | – | – |"
            )
            continue
        actions: dict[str, int] = {}
        for s in steps:
            actions[s["action"]] = actions.get(s["action"], 0) + 1
        last = steps[-1]
        measured = [s["inflation"] for s in steps if s["inflation"] is not None]
        rows.append(
            f"| {key} | {r['contender']}"
            f" | {', '.join(f'{a} {n}' for a, n in actions.items())}"
            f" | {last['concurrency']} / {last['chunk_ms']} ms / {last['duty_cycle']:.2f}"
            f" | {_f(max(measured), 2) if measured else '–'} (budget {_f(last['budget'], 2)})"
            f" | {(last['reason'] or '').replace('|', '/')[:160]}"
            f" | {((r.get('budget_report') or {}).get('verdict') or '–').replace('|', '/')} |"
        )
    if not rows:
        return []
    return [
        "| shape | contender | steps | concurrency / chunk ms / duty cycle after the last"
        " | highest inflation × idle (same rank) | last reason | its report over the run |",
        "|---|---|---|--:|--:|---|---|",
        *rows,
    ]


def _geometry(data: dict, key: str) -> str:
    for r in _by(data, key).values():
        s = r.get("setup") or {}
        if s.get("chunking"):
            return f"{s['chunking']} chunks ({s.get('chunking_reason', '')})"
    return ""


def matrix_targets(data: dict, size: str) -> list[str]:
    """The issue's targets per shape: 2 workers guard off ≥ 0.8× the key-range loop, 2 workers
    ≥ 1.2× 1 worker; guard on: fg p99 ≤ 1.5× idle, no stall over 50 ms, ≥ 0.5× the loop.
    With ``keyrange-2`` in the run, one more column: the loop on two connections ÷ on one, what
    two streams of DELETEs gain on the machine (the ceiling of 2w ÷ 1w)."""
    ceiling = any(r["contender"] == "keyrange-2" for r in data["runs"])
    out = [
        "| shape | 2w ÷ key-range (≥ 0.8) | 2w ÷ 1w (≥ 1.2) | guard: fg p99 × idle (≤ 1.5)"
        " | guard: fg max ms (≤ 50) | guard ÷ key-range (≥ 0.5) |"
        + (" key-range, 2 connections ÷ 1 |" if ceiling else ""),
        "|---|--:|--:|--:|--:|--:|" + ("--:|" if ceiling else ""),
    ]

    def cell(value, ok) -> str:
        if value is None:
            return "–"
        return f"{_f(value, 2)} {'met' if ok(value) else '**missed**'}"

    for key in data["datasets"]:
        shape, _, label = key.partition("/")
        if label != size:
            continue
        runs = _by(data, key)
        rate = {n: (r.get("rows_per_s") if not r.get("refused") else None) for n, r in runs.items()}
        guard = runs.get("product-2w-guard", {})
        fg = guard.get("foreground") or {}
        idle = data["idle"].get(key, {})
        out.append(
            f"| {shape}"
            f" | {cell(_ratio(rate.get('product-2w'), rate.get('keyrange')), lambda v: v >= 0.8)}"
            f" | {cell(_ratio(rate.get('product-2w'), rate.get('product-1w')), lambda v: v >= 1.2)}"
            f" | {cell(_ratio(fg.get('p99'), idle.get('p99')), lambda v: v <= 1.5)}"
            f" | {cell(fg.get('max'), lambda v: v <= 50)}"
            f" | {cell(_ratio(rate.get('product-2w-guard'), rate.get('keyrange')), lambda v: v >= 0.5)} |"
            + (
                f" {_f(_ratio(rate.get('keyrange-2'), rate.get('keyrange')), 2)} |"
                if ceiling
                else ""
            )
        )
    return out


def markdown(data: dict) -> str:
    if data.get("matrix"):
        return matrix_markdown(data)
    m = data["machine"]
    lines = [
        f"Benchmark ({data['mode']} mode), {data['started_at']} — {m.get('cpus')} CPUs ({m.get('cpu', '')}),"
        f" {m.get('mem_gb')} GB, PostgreSQL {data['server']}; chunk size {data['chunk_size']},"
        f" foreground {data['rate']:.0f} ops/s; total {data['total_s']:.0f} s.",
        "",
    ]
    for key in data["datasets"]:
        if not key.startswith("base/"):
            continue
        facts = data["datasets"][key]
        lines += [
            f"### {key}: {facts['rows']:,} rows, {facts['eligible']:,} eligible",
            "",
            *main_table(data, key),
            "",
            f"Foreground latency and drain rate, {key}:",
            "",
            *guard_table(data, key),
            "",
            f"Targets, {key} (ratios of this run):",
            "",
            "| target | measured | wanted | met |",
            "|---|--:|--:|---|",
            *[
                f"| {t} | {v} | {w} | {'yes' if ok else ('–' if ok is None else '**no**')} |"
                for t, v, w, ok in targets(data, key)
            ],
            "",
        ]
    if any(not k.startswith("base/") for k in data["datasets"]):
        lines += ["### Variants", "", *variant_table(data), ""]
    lines += ["### Planning cost and memory", "", *scale_table(data), ""]
    return "\n".join(lines)


def svg_chart(data: dict) -> str:
    """Two bar panels for the largest base dataset: drain rate (× single DELETE) and foreground
    p99 (ms, with the idle baseline). Hand-drawn SVG: no plotting library."""
    if data.get("matrix"):
        return matrix_chart(data)
    keys = [k for k in data["datasets"] if k.startswith("base/")]
    key = keys[-1]
    runs = list(_by(data, key).values())
    idle = data["idle"].get(key, {})
    single = next((r["rows_per_s"] for r in runs if r["contender"] == "single"), None) or 1
    panel1 = [
        (
            r["label"],
            r["rows_per_s"] or 0,
            f"{(r['rows_per_s'] or 0):,.0f} rows/s  ({(r['rows_per_s'] or 0) / single:.2f}×)",
        )
        for r in runs
    ]
    panel2 = [("no cleanup (idle)", idle.get("p99") or 0, f"{idle.get('p99') or 0:.1f} ms")] + [
        (r["label"], r["foreground"].get("p99") or 0, f"{r['foreground'].get('p99') or 0:.1f} ms")
        for r in runs
    ]
    title = (
        f"Retention Runner vs hand-written deletes — {key}"
        f" rows, {data['machine'].get('cpus')} CPUs, one run"
    )
    return bars_svg(
        title,
        [
            ("Drain rate (rows deleted per second, wall clock)", panel1, "#3b6ea8"),
            ("Foreground p99 latency under the same load (open loop, ms)", panel2, "#c0504d"),
        ],
    )


def matrix_chart(data: dict) -> str:
    """The shape matrix at its largest size: the product's drain rate as a multiple of the
    key-range loop, and foreground p99 as a multiple of idle, per shape."""
    size = list(dict.fromkeys(k.partition("/")[2] for k in data["datasets"]))[-1]
    rate, fg = [], []
    for key in data["datasets"]:
        shape, _, label = key.partition("/")
        if label != size:
            continue
        runs = _by(data, key)
        idle = data["idle"].get(key, {}).get("p99")
        loop = runs.get("keyrange", {}).get("rows_per_s")
        for name in ("product-1w", "product-2w", "product-2w-guard"):
            r = runs.get(name)
            if r is None:
                continue
            if r.get("refused"):
                rate.append((f"{shape}: {_SHORT[name]}", 0, "refused"))
                continue
            x = _ratio(r["rows_per_s"], loop)
            rate.append((f"{shape}: {_SHORT[name]}", x or 0, f"{_f(x, 2)}× key-range loop"))
            if name != "product-1w":
                y = _ratio(r["foreground"].get("p99"), idle)
                fg.append((f"{shape}: {_SHORT[name]}", y or 0, f"{_f(y, 2)}× idle p99"))
    return bars_svg(
        f"Shape matrix, {size} rows — {data['machine'].get('cpus')} CPUs, one run,"
        f" commit {data.get('commit', '?')}",
        [
            ("Product drain rate ÷ hand-written key-range loop (same shape)", rate, "#3b6ea8"),
            ("Foreground p99 ÷ idle p99 (same shape)", fg, "#c0504d"),
        ],
    )


def bars_svg(title: str, panels: list[tuple[str, list[tuple[str, float, str]], str]]) -> str:
    """Horizontal bar panels (title, [(label, value, text)], colour) in one SVG."""
    bar_h, gap, left, width = 22, 8, 390, 360
    count = sum(len(items) for _, items, _ in panels)
    height = 70 + count * (bar_h + gap) + 35 * len(panels)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 190}" height="{height}"'
        ' font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    y = 50

    def panel(title, items, color):
        nonlocal y
        parts.append(f'<text x="10" y="{y}" font-weight="bold">{escape(title)}</text>')
        y += 10
        top = max((v for _, v, _ in items), default=1) or 1
        for label, value, text in items:
            w = max(1, value / top * width)
            parts.append(
                f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            )
            parts.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>'
            )
            parts.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}">{escape(text)}</text>')
            y += bar_h + gap
        y += 24

    for name, items, color in panels:
        panel(name, items, color)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def to_png(svg: Path) -> Path | None:
    """Render ``svg`` to PNG beside it with rsvg-convert or ImageMagick, if installed."""
    png = svg.with_suffix(".png")
    if shutil.which("rsvg-convert"):
        cmd = ["rsvg-convert", "-o", str(png), str(svg)]
    elif shutil.which("convert"):
        cmd = ["convert", "-density", "110", str(svg), str(png)]
    else:
        return None
    done = subprocess.run(cmd, capture_output=True, check=False)
    return png if done.returncode == 0 and png.exists() else None
