"""Drain window: will a policy's backlog clear before the next retention boundary?"""

from __future__ import annotations


def drain_window(policy) -> dict:
    """``{"backlog_rows", "oldest_eligible_age_s", "rows_per_s", "eta_s", "next_tick", "verdict": "converges"|"at risk"|"unknown",
    "explanation": str}`` for the policy's current (or latest) run."""
    return {
        "backlog_rows": None,
        "oldest_eligible_age_s": None,
        "rows_per_s": None,
        "eta_s": None,
        "next_tick": None,
        "verdict": "unknown",
        "explanation": "not measured yet",
    }
