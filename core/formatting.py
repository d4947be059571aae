"""Numbers, instants and state names as people read them: one formatter each, used by pages
and messages (the template filters in ``core.templatetags.formatting`` are these functions)."""

from __future__ import annotations

import re
from datetime import date, datetime
from decimal import Decimal

from django.utils import timezone


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


def until(instant: datetime | None) -> str:
    """How long until ``instant``, as ``duration`` says it (``40s``, ``12m``, ``3h 05m``):
    never "0 minutes" for a tick less than a minute away; ``—`` without one."""
    if instant is None:
        return "—"
    return duration((instant - timezone.now()).total_seconds())


def eta(progress) -> str:
    """A run's ETA as the range it is known to (``progress.eta_range_s``): ``40s – 1m 10s``;
    ``—`` without one."""
    span = getattr(progress, "eta_range_s", None)
    if span is None:
        return duration(getattr(progress, "eta_s", None))
    soonest, latest = (duration(x) for x in span)
    return soonest if soonest == latest else f"{soonest} – {latest}"


def number(value) -> str:
    """A count with thousands separators: ``499970`` → ``499,970``; ``12.5`` → ``12.5``;
    ``None`` or ``""`` → ``—``. Text that is not a number comes back unchanged."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        try:
            value = Decimal(value.replace(",", ""))
        except ArithmeticError:
            return value
    if isinstance(value, float | Decimal) and value == int(value):
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float | Decimal):
        return f"{value:,.1f}"
    return str(value)


def when(value, precision: str = "seconds") -> str:
    """An instant with its zone, in the server's zone (``TIME_ZONE``):
    ``2026-12-01 13:19:47 UTC``; ``precision="minutes"`` drops the seconds, ``"time"`` the
    date (``13:19:47 UTC``). ISO text (as
    stored in JSON) is parsed first; ``None`` → ``—``."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        if len(value) == 10:  # a date (a `date` column's value) has no zone to show
            return value
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime):
        if timezone.is_naive(value):
            value = timezone.make_aware(value, timezone.get_default_timezone())
        value = timezone.localtime(value)
        fmt = {"minutes": "%Y-%m-%d %H:%M", "time": "%H:%M:%S"}.get(precision, "%Y-%m-%d %H:%M:%S")
        return f"{value.strftime(fmt)} {value.tzname()}"
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


ISO_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def detail_value(value) -> str:
    """One value of an operator action's details, readably: numbers with separators, an ISO
    instant with its zone, a list as its items, ``None`` as ``—``."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float | Decimal):
        return number(value)
    if isinstance(value, str):
        return when(value) if ISO_INSTANT.match(value) else value
    if isinstance(value, list | tuple):
        return ", ".join(detail_value(v) for v in value) or "—"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {v}" for k, v in detail_items(value)) or "—"
    return str(value)


def detail_items(details, prefix: str = "") -> list[tuple[str, str]]:
    """An operator action's details (a JSON object) as ``(label, text)`` pairs in key order;
    a nested object's keys follow its own (``{"split": {"from": 1}}`` → ``("split from",
    "1")``). Not an object: one pair with an empty label."""
    if not isinstance(details, dict):
        return [(prefix, detail_value(details))] if details not in (None, "", [], {}) else []
    items: list[tuple[str, str]] = []
    for key in sorted(details):
        label = f"{prefix} {key}" if prefix else str(key)
        value = details[key]
        if isinstance(value, dict) and value:
            items.extend(detail_items(value, label))
        else:
            items.append((label, detail_value(value)))
    return items


# The one mapping from a stored state name to the words a page shows. Runs, chunks, policy
# versions, dead letters, guard levels and drain-window verdicts share it; a name missing here
# is shown as it is stored (tests/dashboard/test_layout.py checks every model state is here).
STATE_LABELS: dict[str, str] = {
    # runs
    "waiting": "waiting for an earlier run",
    "confirm": "held for confirmation",
    "active": "active",
    "paused": "paused",
    "drained": "drained",
    "counted": "counted",
    "attention": "needs attention",
    "superseded": "superseded",
    "cancelled": "cancelled",
    "skipped": "skipped",
    "expired": "expired unconfirmed",
    # chunks
    "pending": "pending",
    "done": "done",
    "dead": "dead-lettered",
    "split": "split",
    # policy versions
    "draft": "draft",
    "submitted": "awaiting approval",
    "approved": "approved",
    "rejected": "rejected",
    # dead letters
    "open": "open",
    "replayed": "replayed",
    "discarded": "discarded",
    # guard levels
    "ok": "ok",
    "throttled": "throttled",
    "critical": "critical",
}


def state_label(value) -> str:
    """``"confirm"`` → ``"held for confirmation"`` (``STATE_LABELS``)."""
    return STATE_LABELS.get(str(value), str(value))


_DIGITS = re.compile(r"(\d+)")


def natural_key(text) -> tuple:
    """A sort key that orders ``"2"`` before ``"10"`` and ``"t2"`` before ``"t10"``: runs of
    digits compare as numbers, the rest as text (ties keep their order under a stable sort)."""
    parts = _DIGITS.split(str(text if text is not None else ""))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")


def in_words(value) -> str:
    """A value as a person reads it, never a Python repr: ``-`` for none, ``yes``/``no``,
    thousands separators, ``key value; key value`` for a mapping, commas for a list."""
    if value is None or value == "" or value == {} or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, dict):
        return "; ".join(f"{str(k).replace('_', ' ')} {in_words(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(in_words(v) for v in value)
    return str(value)
