"""Schedule ticks of a policy, computed in the policy's own timezone (DST-correct).

A cron expression names wall-clock times; a tick is the instant such a time happens. Where
the policy's clock skips or repeats an interval (a DST change), ticks follow what cron does
(cronie's "Daylight Saving Time and other time changes"): a *fixed-time* schedule (minute and
hour both fixed, e.g. ``30 1 * * *``) fires once per wall-clock time — at the first of the two
instants of a repeated time, and at the moment the clock jumps for a time in a skipped
interval; a schedule whose minute or hour is a wildcard (``*/30 * * * *``, ``0 * * * *``)
follows the clock as it goes: it fires in both copies of a repeated interval and not at all
in a skipped one. A change of three hours or more is a change of the zone's clock, not DST
(Apia skipping 2011-12-30): every schedule follows the new clock — a skipped time does not
fire, a repeated one fires twice (docs/policies.md, "Time").
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from croniter import croniter

# Offset changes below this are handled as DST (cron's "less than three hours"); larger ones
# as a change of the zone's clock.
DST_LIMIT = timedelta(hours=3)
_NEAR = timedelta(hours=27)  # a transition within this of an instant can shift its ticks
_SEARCH_LIMIT = 100_000  # candidate wall-clock times looked at per tick, at most


def _tz(timezone_name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(timezone_name)


def _schedule_of(obj) -> tuple[str, str]:
    return obj.schedule, obj.timezone


def fixed_time(expr: str) -> bool:
    """A fixed-time schedule: neither its minute nor its hour field starts with ``*``
    (cron's test; ``*/30`` and ``*`` are wildcards, ``0-59/30`` is not)."""
    fields = expr.split()
    return not (fields[0].startswith("*") or fields[1].startswith("*"))


def _local(instant: datetime, tz) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def _slack(instant: datetime, tz) -> timedelta:
    """How far wall-clock times around ``instant`` may be out of step with it: the largest
    backward change of the zone's offset within a day of it (none for most instants)."""
    offsets = [(instant + timedelta(hours=h)).astimezone(tz).utcoffset() for h in range(-27, 28, 3)]
    if len(set(offsets)) == 1:
        return timedelta(0)
    return max(max(offsets) - min(offsets), timedelta(hours=1))


def _jump(earlier: datetime, later: datetime, tz) -> datetime:
    """The instant the clock jumped forward, between the two readings of a skipped time
    (``earlier`` read with the offset after the change, ``later`` with the one before)."""
    after = later.astimezone(tz).utcoffset()
    lo, hi = earlier, later
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


def firings(wall: datetime, tz, *, fixed: bool) -> list[datetime]:
    """The instants (UTC) at which a schedule fires for the wall-clock time ``wall`` (naive)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if _local(first, tz) == wall:  # a repeated time: fold 0 is the first instant
        if fixed and second - first < DST_LIMIT:
            return [first]
        return [first, second]
    # a skipped time: fold 0 reads it with the offset before the change (the later instant)
    if fixed and first - second < DST_LIMIT:
        return [_jump(second, first, tz)]
    return []


def next_tick(obj, after: datetime) -> datetime:
    """The first scheduled tick strictly after ``after`` (UTC-aware)."""
    expr, name = _schedule_of(obj)
    tz, fixed = _tz(name), fixed_time(expr)
    it = croniter(expr, _local(after, tz) - _slack(after, tz) - timedelta(minutes=1))
    best: datetime | None = None
    horizon: datetime | None = None  # wall-clock times past this cannot fire before ``best``
    for _ in range(_SEARCH_LIMIT):
        wall = it.get_next(datetime)
        if horizon is not None and wall > horizon:
            return best
        for instant in firings(wall, tz, fixed=fixed):
            if instant > after and (best is None or instant < best):
                best = instant
                horizon = _local(best, tz) + _slack(best, tz)
    raise ValueError(f"schedule {expr!r} has no tick after {after.isoformat()} in reach")


def latest_tick(obj, now: datetime) -> datetime:
    """The newest scheduled tick at or before ``now`` (UTC-aware). ``obj`` has
    ``schedule`` (cron) and ``timezone`` — a Policy or a PolicySpec."""
    expr, name = _schedule_of(obj)
    tz, fixed = _tz(name), fixed_time(expr)
    it = croniter(expr, _local(now, tz) + _slack(now, tz) + timedelta(minutes=1))
    best: datetime | None = None
    horizon: datetime | None = None  # wall-clock times before this cannot fire after ``best``
    for _ in range(_SEARCH_LIMIT):
        wall = it.get_prev(datetime)
        if horizon is not None and wall < horizon:
            return best
        for instant in firings(wall, tz, fixed=fixed):
            if instant <= now and (best is None or instant > best):
                best = instant
                horizon = _local(best, tz) - _slack(best, tz)
    raise ValueError(f"schedule {expr!r} has no tick before {now.isoformat()} in reach")


def ticks_before(obj, now: datetime, *, after: datetime, limit: int) -> list[datetime]:
    """The ticks in (after, now), newest first, at most ``limit``: what ``latest_tick`` asked
    again before each tick it returns gives, from one walk back over the wall-clock times
    (one cron iterator, not one per tick). A tick found is final once the walk is below the
    wall-clock times that could still fire after it (``latest_tick``'s horizon)."""
    expr, name = _schedule_of(obj)
    tz, fixed = _tz(name), fixed_time(expr)
    it = croniter(expr, _local(now, tz) + _slack(now, tz) + timedelta(minutes=1))
    floor = _local(after, tz) - _slack(after, tz)  # walls below it fire at or before ``after``
    found: set[datetime] = set()
    out: list[datetime] = []
    for _ in range(_SEARCH_LIMIT):
        wall = it.get_prev(datetime)
        while found and len(out) < limit:
            best = max(found)
            if wall >= _local(best, tz) - _slack(best, tz):
                break
            found.discard(best)
            out.append(best)
        if len(out) >= limit or wall < floor:
            break
        found.update(t for t in firings(wall, tz, fixed=fixed) if after < t < now)
    return (out + sorted(found, reverse=True))[:limit]


def is_tick(obj, when: datetime) -> bool:
    """Whether ``when`` is one of the schedule's ticks."""
    return next_tick(obj, when - timedelta(microseconds=1)) == when


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


# a manual trigger's period starts no earlier (a tick before it, less a retention, is past
# what a timestamp holds: year 1 less 30 days is no date)
EARLIEST_PERIOD_YEAR = 1970


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
    if local.year < EARLIEST_PERIOD_YEAR:
        raise ValueError(
            f"the period {text[:40]!r} is before {EARLIEST_PERIOD_YEAR}: no run is for so long ago"
        )
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
