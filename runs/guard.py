"""The admission guard: may a chunk start now? (signals, thresholds, reasons)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str = ""
    critical: bool = False


ADMIT = Verdict(True)


def admission(run, spec) -> Verdict:
    """Decide from the latest shared sample whether ``run`` may start a chunk."""
    return ADMIT


def current_state(policy) -> dict:
    """The guard as the dashboard shows it for ``policy``:
    ``{"level": "ok"|"throttled"|"critical", "reasons": [str], "signals": {name: {"value", "threshold", "unit"}},
    "sampled_at": datetime|None}``."""
    return {"level": "ok", "reasons": [], "signals": {}, "sampled_at": None}
