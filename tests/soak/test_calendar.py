"""The calendar test (tests/soak/calendar.py): schedules across DST changes of Berlin, New
York, Dublin and Lord Howe and Apia's skipped day, daily crons in a skipped and a repeated
hour, on a fake clock, with outages, lost and crashed triggers, pauses, approvals and spells
of guard refusals.

Short by default (3 fake hours around each of eight edges); set ``RETENTION_CALENDAR_HOURS``
(e.g. 48) and ``RETENTION_CALENDAR_SEED`` for a long run."""

from __future__ import annotations

import os

import pytest

from tests.soak.calendar import simulate

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_allowed_tick_runs_once_with_its_cutoff_and_nothing_stays_stuck(
    make_user, monkeypatch
):
    hours = float(os.environ.get("RETENTION_CALENDAR_HOURS", "3"))
    seed = int(os.environ.get("RETENTION_CALENDAR_SEED", "18"))
    report = simulate(make_user, monkeypatch, hours=hours, seed=seed)
    print(report.table())
    assert report.problems == [], "\n".join(report.problems[:30]) + "\n" + report.table()
    assert report.fired > 0 and report.passes > 0
    assert all(report.ticks.values()), report.ticks  # every policy has ticks to check
    assert report.guard_episodes > 0 and report.stalls_checked > 0
