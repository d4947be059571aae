"""The drain-window line agrees with the rest of the page: the next tick it names is the
one the schedule is armed for, as of the request; a paused run's pending chunks are a
backlog, never "nothing eligible"."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from runs.actions import pause_run
from runs.engine.schedules import schedule_name
from runs.forecast import drain_window
from runs.models import Chunk

from .test_overview import card_of

pytestmark = pytest.mark.django_db


def _arm(policy, seconds: float) -> None:
    Schedule.objects.update_or_create(
        name=schedule_name(policy),
        defaults={
            "func": "runs.tasks.trigger_scheduled",
            "next_run": timezone.now() + timedelta(seconds=seconds),
            "repeats": 1,
        },
    )


def test_the_window_names_the_armed_next_tick_as_of_the_request(client_for, run):
    started = time.monotonic()
    _arm(run.policy, 20)
    first = drain_window(run.policy, fresh=True)
    elapsed = time.monotonic() - started  # however slowly a busy machine reads the window
    seconds = re.search(r"next tick (?:is )?in (\d+)s", first["explanation"])
    assert seconds, first["explanation"]
    assert 20 - elapsed - 1 <= int(seconds.group(1)) <= 20, (seconds.group(0), elapsed)
    _arm(run.policy, 9.5 * 60)  # the tick fired and the schedule was re-armed for the next
    again = drain_window(run.policy)  # within the cache lifetime of the first reading
    assert re.search(r"next tick (is )?in 9m", again["explanation"]), again["explanation"]
    card = card_of(client_for("viewer").get(reverse("home")).content.decode(), "events")
    # the "Next tick" line beside it says the same, in the same words
    assert re.search(r'data-testid="next-tick">[\s\S]*?\(in 9m \d\ds\)</dd>', card), card
    assert re.search(r"next tick (is )?in 9m", card)
    assert not re.search(r"next tick (is )?in \d+s", card)


def test_a_tick_less_than_a_minute_away_is_not_zero_minutes_away(client_for, run):
    """Django's ``timeuntil`` says "0 minutes" for a tick under a minute away (every policy's
    card, for a minute before each of its ticks): the card says the seconds."""
    client = client_for("viewer")
    started = time.monotonic()
    _arm(run.policy, 30)
    card = card_of(client.get(reverse("home")).content.decode(), "events")
    elapsed = time.monotonic() - started  # however slowly a busy machine renders the page
    tick = re.search(r'data-testid="next-tick">([\s\S]*?)</dd>', card)
    seconds = tick and re.search(r"\(in (\d+)s\)", tick.group(1))
    assert seconds, tick and tick.group(1)
    assert 30 - elapsed - 1 <= int(seconds.group(1)) <= 30, (seconds.group(0), elapsed)
    assert "0\xa0minutes" not in card


def test_a_paused_run_with_pending_chunks_is_not_idle(client_for, run, users):
    pending = Chunk.objects.filter(run=run, state=Chunk.State.PENDING).count()
    assert pending > 0
    deleted = sum(run.audit_records.values_list("rows_deleted", flat=True))
    run.expected_rows = deleted  # an estimate already reached (a capped count)
    run.save(update_fields=["expected_rows"])
    pause_run(run, actor=users["oncall"], reason="looking at replica lag")
    window = drain_window(run.policy)
    assert window["verdict"] == "paused", window
    assert f"{pending} chunks pending" in window["explanation"]
    assert "nothing eligible" not in window["explanation"]
    card = card_of(client_for("viewer").get(reverse("home")).content.decode(), "events")
    assert "nothing eligible" not in card
    assert f"{pending} chunks pending" in card
    page = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert "nothing eligible" not in page
    assert f"{pending} chunks pending" in page


def test_a_window_counts_the_whole_table_only_when_no_open_run_knows_the_backlog(run):
    """A page showing a draining run never counts the table that run is deleting from (the
    run's own figures give the backlog): only the oldest eligible row and a day's inflow are
    read there. With no open run, the eligible count is read too."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.models import Run

    def reads_of_the_table() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            window = drain_window(run.policy, fresh=True)
        return window, [q["sql"] for q in captured.captured_queries if '"rr_events"' in q["sql"]]

    window, reads = reads_of_the_table()
    assert window["backlog_rows"] is not None and window["backlog_rows"] > 0
    assert len(reads) == 2, reads  # the oldest eligible row, a day's inflow
    assert not any("10000000" in sql for sql in reads)
    Run.objects.filter(pk=run.pk).update(state=Run.State.DRAINED)
    window, reads = reads_of_the_table()
    assert len(reads) == 3, reads  # and the eligible rows of the whole table
    assert isinstance(window["backlog_rows"], int)  # counted, not left unknown
