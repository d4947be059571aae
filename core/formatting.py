"""Numbers as people read them: one formatter for durations, used by pages and messages."""

from __future__ import annotations

from decimal import Decimal


def duration(seconds: float | Decimal | int | None) -> str:
    """``93784`` → ``1d 2h``; ``75`` → ``1m 15s``; ``None`` → ``—``."""
    if seconds is None or seconds == "":
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {s:02d}s" if minutes < 10 else f"{minutes}m"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d {h}h"
