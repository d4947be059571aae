"""Schedule ticks of a policy, computed in the policy's own timezone (DST-correct)."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime

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
