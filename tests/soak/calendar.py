"""The calendar simulation: months of schedules compressed into minutes on a fake clock.

Six policies tick through eight windows around the calendar's edges:

| policy | zone | schedule | catch_up, retention | edge |
|---|---|---|---|---|
| berlin | Europe/Berlin | ``*/30 * * * *`` | latest, days | both DST changes of 2026 |
| newyork | America/New_York | ``*/30 * * * *`` | none, hours | both DST changes of 2026 |
| nyfixed | America/New_York | ``30 1,2 * * *`` | latest, days | a cron in the skipped hour (02:30 on 2026-03-08 fires when the clock jumps) and in the repeated one (01:30 on 2026-11-01 fires once) |
| dublin | Europe/Dublin | ``30 1 * * *`` | none, days | negative DST; 01:30 skipped in March, repeated in October |
| lordhowe | Australia/Lord_Howe | ``*/15 * * * *`` | latest, days | a 30-minute DST change; a day later, "1 day" cutoffs fall in its gap |
| apia | Pacific/Apia | ``0 3 * * *`` | latest, days | 2011-12-30 skipped whole; the next day's "1 day" cutoff falls in it |

The engine's own code runs on real PostgreSQL — triggers, the reconciler, admission, the
worker — only the clock is fake and django-q2's scheduler is replaced by a loop that does what
it does (fire each due one-shot, set ``repeats = 0``, enqueue the trigger). At random the
cluster is down for a while (nothing fires, no reconciler pass), a trigger message is lost or
its task crashes before committing, a policy is paused and resumed, a new version is
approved (the superseded period runs again under it), and the guard refuses every chunk for
a while.

Checks (each a problem string in the report): one live run per tick, a re-run naming the
superseded run of its tick; every tick of a "latest" policy run or recorded as skipped, the
ticks computed here without the engine (every real minute of the window read on the
policy's clock: a wildcard schedule fires at each matching minute, a fixed-time one once per
wall-clock time per day — at the first of two instants, at the jump for a skipped time, never
across a change of three hours or more); no run at a time that is not such a tick, and no
wall-clock time of a fixed-time schedule run twice on one local day; every tick of a "none"
policy that fired on time run, and none run late or caught up; each run's cutoff as an
independent computation says; no run waiting longer than an hour of up time with nothing to
wait for; after every reconciler pass every enabled policy's schedule armed and not in the
past; no reconciler pass with a failed or busy policy; and a run that admitted no chunk in a
step never says "progressing" and always says why once the guard window has passed.
"""

from __future__ import annotations

import ast
import random
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone as dj_timezone

WINDOWS = (  # centred on the edges of the calendar the policies below meet
    # Apia's first tick after its skipped day (2011-12-29 24:00 -10 → 12-31 00:00 +14):
    # 03:00 +14, whose "1 day" cutoff falls on the day that never was
    datetime(2011, 12, 30, 13, 0, tzinfo=UTC),
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # New York springs forward
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # Berlin and Dublin spring forward
    datetime(2026, 4, 4, 15, 0, tzinfo=UTC),  # Lord Howe: 02:00 +11 → 01:30 +10:30
    datetime(2026, 10, 3, 15, 30, tzinfo=UTC),  # Lord Howe: 02:00 +10:30 → 02:30 +11
    datetime(2026, 10, 4, 15, 15, tzinfo=UTC),  # a day later: "1 day" cutoffs in that gap
    datetime(2026, 10, 25, 1, 0, tzinfo=UTC),  # Berlin and Dublin fall back
    datetime(2026, 11, 1, 6, 0, tzinfo=UTC),  # New York falls back
)
GRACE = timedelta(minutes=2)
CALM = {"lock_waits": 0, "replication_lag_s": 0.0, "connections_free": 100, "wal_mb_per_s": 0.0}


class Crash(Exception):
    """A trigger task that dies before it commits."""


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Report:
    steps: int = 0
    ticks: dict = field(default_factory=dict)  # slug -> ticks in the checked windows
    runs: dict = field(default_factory=dict)  # slug -> {state: n}
    fired: int = 0
    lost: int = 0
    crashed: int = 0
    late: int = 0
    outages: int = 0
    pauses: int = 0
    approvals: int = 0
    passes: int = 0
    rearmed: int = 0
    caught_up: int = 0
    reruns: int = 0
    guard_episodes: int = 0
    stalls_checked: int = 0
    problems: list = field(default_factory=list)

    def table(self) -> str:
        rows = [
            ("steps", self.steps), ("reconciler passes", self.passes),
            ("schedule firings", self.fired), ("lost trigger messages", self.lost),
            ("crashed triggers", self.crashed), ("late firings", self.late),
            ("cluster outages", self.outages), ("policy pauses", self.pauses),
            ("versions approved", self.approvals), ("schedules re-armed", self.rearmed),
            ("catch-up runs", self.caught_up), ("superseded periods run again", self.reruns),
            ("guard refusal episodes", self.guard_episodes),
            ("runs checked with no admitted chunk", self.stalls_checked),
        ]  # fmt: skip
        for slug, n in self.ticks.items():
            rows.append((f"ticks checked ({slug})", n))
        for slug, states in self.runs.items():
            rows.append(
                (f"runs ({slug})", ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
            )
        rows.append(("problems", len(self.problems)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


POLICIES = {
    "berlin": dict(timezone="Europe/Berlin", schedule="*/30 * * * *", catch_up="latest",
                   retentions=("2 days", "3 days")),
    "newyork": dict(timezone="America/New_York", schedule="*/30 * * * *", catch_up="none",
                    retentions=("36 hours", "30 hours")),
    "nyfixed": dict(timezone="America/New_York", schedule="30 1,2 * * *", catch_up="latest",
                    retentions=("1 day", "2 days")),
    "dublin": dict(timezone="Europe/Dublin", schedule="30 1 * * *", catch_up="none",
                   retentions=("1 day", "7 days")),
    "lordhowe": dict(timezone="Australia/Lord_Howe", schedule="*/15 * * * *",
                     catch_up="latest", retentions=("1 day", "2 days")),
    "apia": dict(timezone="Pacific/Apia", schedule="0 3 * * *", catch_up="latest",
                 retentions=("1 day", "2 days")),
}  # fmt: skip


def simulate(make_user, monkeypatch, *, hours: float, seed: int) -> Report:
    """Run the calendar for ``hours`` of fake time around each DST change."""
    from django.conf import settings
    from django_q.models import OrmQ, Schedule

    from retention.actions import pause_policy, resume_policy
    from retention.models import Policy
    from runs import tasks
    from runs.actions import BLOCKING
    from runs.engine import reconciler, schedules, worker
    from runs.models import GuardSample, Run
    from runs.progress import progress_for
    from runs.status import health_of
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import create_events

    rng = random.Random(seed)
    clock = Clock(WINDOWS[0] - timedelta(hours=hours / 2 + 1))
    monkeypatch.setattr(dj_timezone, "now", clock)
    monkeypatch.setattr(settings, "RETENTION", {**settings.RETENTION, "GUARD": False})
    report = Report()
    oncall = make_user("calendar-oncall", "oncall")
    version_no = {slug: 0 for slug in POLICIES}

    def approve(slug: str) -> None:
        cfg = POLICIES[slug]
        retention = cfg["retentions"][version_no[slug] % 2]
        version_no[slug] += 1
        approved_policy(
            make_user,
            **events_spec(
                slug=slug, table=f"rr_cal_{slug}", schedule=cfg["schedule"],
                timezone=cfg["timezone"], retention=retention, catch_up=cfg["catch_up"],
            ),
        )  # fmt: skip

    for slug in POLICIES:
        create_events(200, name=f"rr_cal_{slug}")
        approve(slug)
    policies = {p.slug: p for p in Policy.objects.filter(slug__in=POLICIES)}

    created_at: dict[int, datetime] = {}  # run id -> fake time first seen
    fired_on_time: set = set()  # (slug, tick) fired within grace, not lost: must have run
    waiting_since: dict[int, datetime] = {}
    paused_until: dict[str, datetime] = {}
    down_until: datetime | None = None
    guard_until: datetime | None = None  # the guard refuses every chunk until then
    checked: list[tuple[datetime, datetime]] = []

    def note_new_runs() -> None:
        for run_id in Run.objects.exclude(pk__in=list(created_at)).values_list("pk", flat=True):
            created_at[run_id] = clock.now

    def fire_due() -> None:
        for s in Schedule.objects.filter(
            func=schedules.TRIGGER_TASK, next_run__lt=clock.now
        ).exclude(repeats=0):
            kwargs = ast.literal_eval(s.kwargs)
            tick = s.next_run
            s.repeats = 0
            s.save()
            report.fired += 1
            slug = Policy.objects.get(pk=kwargs["policy_id"]).slug
            fate = rng.random()
            if fate < 0.03:
                report.lost += 1
                continue
            if fate < 0.05:
                report.crashed += 1
                try:
                    with transaction.atomic():
                        tasks.trigger_scheduled(
                            policy_id=kwargs["policy_id"], tick=tick.isoformat()
                        )
                        raise Crash
                except Crash:
                    pass
                continue
            if clock.now - tick > GRACE:
                report.late += 1
            else:
                fired_on_time.add((slug, tick))
            tasks.trigger_scheduled(policy_id=kwargs["policy_id"], tick=tick.isoformat())
            note_new_runs()

    def reconcile_pass() -> None:
        out = reconciler.reconcile()
        report.passes += 1
        report.rearmed += len(out["rearmed"])
        report.caught_up += len(out["caught_up"])
        report.reruns += len(out["rerun"])
        for key in ("failed", "busy", "deferred"):
            if out[key]:
                report.problems.append(f"{clock.now:%m-%d %H:%M} reconciler {key}: {out[key]}")
        note_new_runs()
        # the policies as the pass left them, and their schedules: one read each
        policies.update({p.slug: p for p in Policy.objects.filter(slug__in=POLICIES)})
        names = [schedules.schedule_name(p) for p in policies.values()]
        armed = {s.name: s for s in Schedule.objects.filter(name__in=names)}
        for slug, policy in policies.items():
            s = armed.get(schedules.schedule_name(policy))
            if s is None or s.repeats != 1 or s.next_run < clock.now - GRACE:
                report.problems.append(
                    f"{clock.now:%m-%d %H:%M} {slug}: schedule not armed after a pass "
                    f"({None if s is None else (s.repeats, s.next_run.isoformat())})"
                )

    def drain_active() -> None:
        refusing = guard_until is not None and clock.now < guard_until
        for run in Run.objects.filter(state=Run.State.ACTIVE, policy__paused=False):
            if refusing:
                # the guard turns while the run drains: a chunk is admitted, then none
                settings.RETENTION = {**settings.RETENTION, "GUARD": False}
                worker.process_one(run)
                # a fresh sample (on the fake clock): lock waits over every threshold
                GuardSample.objects.create(values={**CALM, "lock_waits": 20}, tables={})
            settings.RETENTION = {**settings.RETENTION, "GUARD": refusing}
            stats = worker.drain(run.pk, until_idle=True, budget_s=20)
            if not stats["chunks"]:
                check_stall(Run.objects.select_related("policy_version").get(pk=run.pk))
        OrmQ.objects.all().delete()  # lease messages: the drain above is their worker
        note_new_runs()

    def check_stall(run) -> None:
        """The run admitted no chunk in this step: looked at once the guard window has passed
        (real time: the ledger's commit times are the database's), it must not say
        "progressing", and it must say why."""
        if run.state != Run.State.ACTIVE:
            return
        report.stalls_checked += 1
        later = datetime.now(UTC) + timedelta(seconds=settings.RETENTION["GUARD_DUTY_WINDOW_S"] + 1)
        progress = progress_for([run.pk], now=later)[run.pk]
        health, why, _ = health_of(run, progress, later)
        if health == "progressing" or (health != "finishing" and not why):
            report.problems.append(
                f"{clock.now:%m-%d %H:%M} {run.run_key}: admitted no chunk, says {health!r}"
                f" ({why or 'no reason'})"
            )

    def watch_waiting(step: timedelta) -> None:
        up = down_until is None
        for run in Run.objects.filter(state=Run.State.WAITING).select_related("policy"):
            blocked = Run.objects.filter(policy=run.policy, state__in=BLOCKING).exists()
            if not up or run.policy.paused or blocked:
                continue
            waiting_since[run.pk] = waiting_since.get(run.pk, timedelta(0)) + step
            if waiting_since[run.pk] > timedelta(hours=1):
                report.problems.append(f"{run.run_key}: waiting for nothing for over an hour")
                waiting_since[run.pk] = timedelta(-1000)  # report once

    for n, centre in enumerate(WINDOWS):
        start, end = centre - timedelta(hours=hours / 2), centre + timedelta(hours=hours / 2)
        clock.now = max(clock.now, start)
        checked.append((start, end - timedelta(hours=1)))
        down_until = None
        window_paused = window_approved = window_guarded = False
        while clock.now < end:
            step = timedelta(minutes=rng.randint(4, 16))
            if (
                down_until is None
            ):  # django-q2's scheduler polls every ~30 s while the cluster is up
                target = clock.now + step
                while True:
                    due = (
                        Schedule.objects.filter(func=schedules.TRIGGER_TASK, next_run__lte=target)
                        .exclude(repeats=0)
                        .order_by("next_run")
                        .values_list("next_run", flat=True)
                        .first()
                    )
                    if due is None or due < clock.now:
                        break
                    clock.now = due + timedelta(seconds=rng.randint(1, 40))
                    fire_due()
                clock.now = max(clock.now, target)
            else:
                clock.now += step
            report.steps += 1
            if down_until is not None and clock.now >= down_until:
                down_until = None
            if down_until is None and rng.random() < 0.04 and clock.now < end - timedelta(hours=2):
                down_until = clock.now + timedelta(minutes=rng.randint(30, 240))
                report.outages += 1
            for slug, until in list(paused_until.items()):
                if clock.now >= until:
                    resume_policy(policies[slug], actor=oncall, reason="calendar: resume")
                    del paused_until[slug]
            # besides the random ones, every window has one pause and one approval
            forced_pause = not window_paused and clock.now >= start + timedelta(hours=hours / 4)
            forced_approval = not window_approved and clock.now >= centre
            if forced_approval:
                window_approved = True
                approve(list(POLICIES)[n % len(POLICIES)])
                report.approvals += 1
            if forced_pause or (rng.random() < 0.015 and clock.now < end - timedelta(hours=2)):
                window_paused = True
                slug = rng.choice([s for s in POLICIES if s not in paused_until] or ["-"])
                if slug != "-":
                    pause_policy(policies[slug], actor=oncall, reason="calendar: pause")
                    pause = rng.randint(60, 180) if hours >= 12 else rng.randint(30, 90)
                    paused_until[slug] = clock.now + timedelta(minutes=pause)
                    report.pauses += 1
            if rng.random() < 0.01:
                approve(rng.choice(list(POLICIES)))
                report.approvals += 1
            # besides the random ones, every window has one spell of guard refusals
            forced_guard = not window_guarded and clock.now >= start + timedelta(hours=hours / 3)
            if (guard_until is None or clock.now >= guard_until) and (
                forced_guard or rng.random() < 0.03
            ):
                window_guarded = True
                guard_until = clock.now + timedelta(minutes=rng.randint(20, 60))
                report.guard_episodes += 1
            if down_until is None:
                fire_due()
                reconcile_pass()
                drain_active()
            watch_waiting(step)
        # the window ends quietly: the cluster is up, nothing is paused, the guard is calm
        down_until = guard_until = None
        for slug in list(paused_until):
            resume_policy(policies[slug], actor=oncall, reason="calendar: resume")
            del paused_until[slug]
        for _ in range(4):
            clock.now += timedelta(minutes=10)
            fire_due()
            reconcile_pass()
            drain_active()
        if n + 1 < len(WINDOWS):
            clock.now = WINDOWS[n + 1] - timedelta(hours=hours / 2)  # months pass, cluster down

    _check(report, policies, checked, created_at, fired_on_time)
    return report


def _expected_cutoffs(tick: datetime, retention: str, tz: str) -> set[datetime]:
    """The cutoff computed without the engine: hours elapsed; days on the wall clock (both
    readings of a wall-clock time that is repeated or skipped are accepted)."""
    amount, unit = retention.split()
    if unit.startswith("hour"):
        return {tick - timedelta(hours=int(amount))}
    local = tick.astimezone(zoneinfo.ZoneInfo(tz))
    wall = (local.replace(tzinfo=None) - timedelta(days=int(amount))).replace(
        tzinfo=zoneinfo.ZoneInfo(tz)
    )
    return {wall.replace(fold=f).astimezone(UTC) for f in (0, 1)}


def _expected_ticks(schedule: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """The ticks in [start, end] as cron fires them, computed without the engine: every real
    minute of the span (and three hours around it) read on the policy's clock. A wildcard
    schedule (``*/N * * * *``) fires at each minute whose wall-clock time matches — in both
    copies of a repeated interval, never in a skipped one. A fixed-time schedule (``M H1,H2 *
    * *``) fires once per wall-clock time per day: at the first of its instants, or — for a
    time the clock skipped, by less than three hours — at the minute the clock jumped."""
    zone = zoneinfo.ZoneInfo(tz)
    minute_field, hour_field = schedule.split()[:2]
    lo, hi = start - timedelta(hours=3), end + timedelta(hours=3)
    lo = lo.replace(second=0, microsecond=0)
    minutes = []  # (instant, local wall-clock time), one per real minute
    t = lo
    while t <= hi:
        minutes.append((t, t.astimezone(zone).replace(tzinfo=None)))
        t += timedelta(minutes=1)
    out = set()
    if minute_field.startswith("*") or hour_field.startswith("*"):
        step = int(minute_field.split("/")[1]) if "/" in minute_field else 1
        out = {t for t, wall in minutes if wall.minute % step == 0}
    else:
        at = [(int(h), int(m)) for h in hour_field.split(",") for m in minute_field.split(",")]
        days = sorted({wall.date() for _, wall in minutes})
        for day in days:
            for hour, minute in at:
                wall = datetime(day.year, day.month, day.day, hour, minute)
                instants = [t for t, w in minutes if w == wall]
                if instants:
                    out.add(instants[0])
                    continue
                for (_t0, w0), (t1, w1) in zip(minutes, minutes[1:], strict=False):
                    jumped = w1 - w0 - timedelta(minutes=1)
                    if w0 < wall < w1 and timedelta(0) < jumped < timedelta(hours=3):
                        out.add(t1)
    return sorted(t for t in out if start <= t <= end)


def _wildcard(schedule: str) -> bool:
    minute_field, hour_field = schedule.split()[:2]
    return minute_field.startswith("*") or hour_field.startswith("*")


def _check(report, policies, checked, created_at, fired_on_time) -> None:
    from collections import Counter

    from runs.models import Run

    for slug, policy in policies.items():
        runs = list(Run.objects.filter(policy=policy).select_related("policy_version"))
        report.runs[slug] = dict(Counter(r.state for r in runs))
        # invariant 1: one live run per tick; a superseded period runs again under the newly
        # approved version, and that re-run names the run it replaces
        per_tick = Counter(r.tick for r in runs if r.state != Run.State.SUPERSEDED)
        for tick, n in per_tick.items():
            if n > 1:
                report.problems.append(f"{slug}: {n} live runs for tick {tick.isoformat()}")
        by_id = {r.pk: r for r in runs}
        for r in runs:
            old = by_id.get(r.replaces_id) if r.replaces_id else None
            if r.replaces_id and (
                old is None or old.tick != r.tick or old.state != Run.State.SUPERSEDED
            ):
                report.problems.append(f"{r.run_key}: replaces no superseded run of its tick")
        ran = {r.tick for r in runs}  # a superseded run ran too, under the older version
        recorded = Counter(t for r in runs for t in r.skipped_ticks)
        drained = {r.tick for r in runs if r.state == Run.State.DRAINED}
        for tick in drained:
            if recorded[tick.isoformat()]:
                report.problems.append(f"{slug}: tick {tick.isoformat()} ran and was skipped")
        for r in runs:
            spec = r.policy_version.parsed
            if r.cutoff not in _expected_cutoffs(r.tick, spec.retention, policy.timezone):
                report.problems.append(
                    f"{r.run_key}: cutoff {r.cutoff.isoformat()} for retention {spec.retention}"
                )
            if r.state in Run.OPEN and r.state != Run.State.ACTIVE:
                report.problems.append(f"{r.run_key}: still {r.state} at the end")
        cfg = POLICIES[slug]
        ticks = [
            t
            for start, end in checked
            for t in _expected_ticks(cfg["schedule"], cfg["timezone"], start, end)
        ]
        report.ticks[slug] = len(ticks)
        # every run at a time cron fires (manual runs aside); a fixed-time schedule once per
        # wall-clock time per day
        firings = {
            t for r in runs for t in _expected_ticks(cfg["schedule"], cfg["timezone"],
                                                      r.tick - timedelta(hours=1),
                                                      r.tick + timedelta(hours=1))
        }  # fmt: skip
        zone = zoneinfo.ZoneInfo(cfg["timezone"])
        for r in runs:
            if r.source != "manual" and r.tick not in firings:
                report.problems.append(f"{r.run_key}: tick {r.tick.isoformat()} is not a firing")
        if not _wildcard(cfg["schedule"]):
            walls = Counter(
                r.tick.astimezone(zone).strftime("%Y-%m-%d %H:%M")
                for r in runs
                if r.state != Run.State.SUPERSEDED
            )
            for wall, n in walls.items():
                if n > 1:
                    report.problems.append(f"{slug}: {n} runs at {wall} local time")
        if POLICIES[slug]["catch_up"] == "latest":
            for tick in ticks:
                if tick not in ran and not recorded[tick.isoformat()]:
                    near = [  # the policy's runs around it, to see what happened
                        (f"{r.tick:%m-%d %H:%M}Z", r.state, r.source, r.policy_version.number,
                         [t[11:16] for t in r.skipped_ticks][-5:])
                        for r in sorted(runs, key=lambda r: r.tick)
                        if abs(r.tick - tick) < timedelta(hours=3)
                    ]  # fmt: skip
                    report.problems.append(
                        f"{slug}: tick {tick.isoformat()} neither run nor skipped {near}"
                    )
        else:
            for r in runs:
                if r.source == "catch-up":
                    report.problems.append(f"{r.run_key}: a catch-up run under catch_up = none")
                late = created_at.get(r.pk, r.tick) - r.tick > GRACE
                if r.source == "schedule" and late and r.replaces_id is None:
                    report.problems.append(f"{r.run_key}: ran late under catch_up = none")
            for s, tick in fired_on_time:
                if s == slug and tick not in ran:
                    report.problems.append(f"{slug}: tick {tick.isoformat()} fired but no run")
