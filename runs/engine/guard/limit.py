"""The foreground's limit, as the team states its SLO: an absolute p99 in milliseconds
(``guard.fg_p99_ms``), or relative to the idle p99 with a floor — max(``inflation`` × idle,
idle + ``margin_ms``) — on the signal the team chooses (the built-in probe, the application's
own p99 from Prometheus, or both). Every judgment of the foreground's latency (the
controller's step, the reason a chunk waits, the badge) reads its limit from here, in
milliseconds."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from runs.engine.guard.common import _fmt


@dataclass(frozen=True)
class Limit:
    """``fg_p99_ms``: the absolute limit (None: relative); ``inflation`` and ``margin_ms``: the
    relative limit over an idle p99; ``signal``: "probe", "prometheus" or "both"."""

    fg_p99_ms: float | None
    inflation: float
    margin_ms: float
    signal: str

    @property
    def absolute(self) -> bool:
        return self.fg_p99_ms is not None

    def relative_ms(self, idle: float) -> float:
        """The relative limit over an idle value: its multiple, and at least the margin above."""
        return max(idle * self.inflation, idle + self.margin_ms)

    def ms(self, idle: float | None) -> float | None:
        """The limit in milliseconds (None: relative and no idle value to judge by)."""
        if self.fg_p99_ms is not None:
            return self.fg_p99_ms
        return None if idle is None else round(self.relative_ms(idle), 3)

    def words(self, idle: float | None) -> str:
        """The limit and where it comes from: ``limit 25 ms (fg_p99_ms)`` or ``limit 6.2 ms
        (max(2 × idle, idle + 5 ms))``."""
        if self.fg_p99_ms is not None:
            return f"limit {_fmt(float(self.fg_p99_ms))} ms (fg_p99_ms)"
        rule = f"max({_fmt(self.inflation)} × idle, idle + {_fmt(self.margin_ms)} ms)"
        if idle is None:
            return f"limit {rule}"
        return f"limit {_fmt(float(self.ms(idle)))} ms ({rule})"


def limit_of(spec) -> Limit:
    """The policy's limit: each ``[guard]`` key, else the instance's setting."""
    cfg = settings.RETENTION
    return Limit(
        fg_p99_ms=spec.fg_p99_ms if spec.fg_p99_ms is not None else cfg.get("GUARD_FG_P99_MS"),
        inflation=budget_of(spec),
        margin_ms=float(
            spec.margin_ms if spec.margin_ms is not None else cfg["GUARD_PROBE_MARGIN_MS"]
        ),
        signal=spec.signal or cfg.get("GUARD_SIGNAL") or "probe",
    )


def budget_of(spec) -> float:
    """The policy's inflation: how many times its idle p99 the foreground may read while its
    chunks run (``guard.inflation``, or its older name ``guard.inflation_budget``, else
    ``RETENTION_GUARD_INFLATION``)."""
    own = spec.inflation if spec.inflation is not None else spec.inflation_budget
    if own is not None:
        return float(own)
    return float(settings.RETENTION["GUARD_PROBE_RATIO"])


def _limit(base: float, budget: float, margin_ms: float | None = None) -> float:
    """The relative limit over an idle value: the budget's multiple, and at least the margin
    above it (``RETENTION_GUARD_MARGIN_MS``: jitter is no pressure)."""
    margin = settings.RETENTION["GUARD_PROBE_MARGIN_MS"] if margin_ms is None else margin_ms
    return max(base * budget, base + float(margin))
