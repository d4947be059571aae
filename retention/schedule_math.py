"""Schedule ticks of a policy, computed in the policy's own timezone (DST-correct)."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from croniter import croniter


def _tz(timezone_name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(timezone_name)


def _schedule_of(obj) -> tuple[str, str]:
    return obj.schedule, obj.timezone


def latest_tick(obj, now: datetime) -> datetime:
    """The newest scheduled tick at or before ``now`` (UTC-aware). ``obj`` has
    ``schedule`` (cron) and ``timezone`` — a Policy or a PolicySpec."""
    expr, tz = _schedule_of(obj)
    local_now = now.astimezone(_tz(tz))
    it = croniter(expr, local_now)
    if (
        croniter.match(expr, local_now.replace(second=0, microsecond=0))
        and local_now.second == 0
        and local_now.microsecond == 0
    ):
        return local_now.astimezone(UTC)
    return it.get_prev(datetime).astimezone(UTC)


def next_tick(obj, after: datetime) -> datetime:
    """The first scheduled tick strictly after ``after`` (UTC-aware)."""
    expr, tz = _schedule_of(obj)
    return croniter(expr, after.astimezone(_tz(tz))).get_next(datetime).astimezone(UTC)


def ticks_between(obj, start: datetime, end: datetime, *, limit: int = 1000) -> Iterator[datetime]:
    """Ticks in (start, end], oldest first, at most ``limit``."""
    tick = start
    for _ in range(limit):
        tick = next_tick(obj, tick)
        if tick > end:
            return
        yield tick


def period_label(obj, tick: datetime) -> str:
    """The logical period of a tick as wall-clock time in the policy's timezone, unique per
    tick: a wall-clock time that happens twice (the hour repeated when clocks fall back) carries
    its UTC offset — ``2026-11-01T01:30-04:00`` then ``2026-11-01T01:30-05:00``."""
    _, tz = _schedule_of(obj)
    local = tick.astimezone(_tz(tz))
    label = local.strftime("%Y-%m-%dT%H:%M")
    if local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
        offset = local.strftime("%z")
        label += f"{offset[:3]}:{offset[3:]}"
    return label


def tick_for_period(obj, text: str | None, now: datetime) -> datetime:
    """The tick a manual trigger stands for: the newest scheduled tick at or before the given
    local date/time in the policy's zone (a date means the end of that day: today's date
    names today's tick once it has passed), or the latest tick before ``now``. ``ValueError``
    (one sentence) for bad or future input: the CLI's ``trigger --period`` and the policy
    page's form read it the same way."""
    text = (text or "").strip()
    if not text:
        return latest_tick(obj, now)
    day = len(text) == 10
    try:
        local = datetime.fromisoformat(text)
        if day:
            local = local.replace(hour=23, minute=59, second=59)
    except ValueError:
        raise ValueError(
            f"the period must be YYYY-MM-DD or YYYY-MM-DDTHH:MM, got {text[:40]!r}"
        ) from None
    zone = _schedule_of(obj)[1]
    if local.tzinfo is None:
        local = local.replace(tzinfo=_tz(zone))
    if day and local > now >= local.replace(hour=0, minute=0, second=0):
        # today: the day's newest tick that has passed, if one has
        start = local.replace(hour=0, minute=0, second=0)
        tick = latest_tick(obj, now)
        if tick >= start:
            return tick
        first = next_tick(obj, start - timedelta(microseconds=1))
        raise ValueError(
            f"no tick of {text} has passed yet: the first is at "
            f"{first.astimezone(_tz(zone)):%H:%M} ({zone}); give an earlier period or "
            "trigger after it"
        )
    if local > now:
        raise ValueError("the period is in the future; a run can only be triggered for a past tick")
    return latest_tick(obj, local)
