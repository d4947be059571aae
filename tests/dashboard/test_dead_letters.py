from __future__ import annotations

import pytest
from django.urls import reverse

from core.models import OperatorAction
from runs.models import Chunk, DeadLetter

from .helpers import post

pytestmark = pytest.mark.django_db


def test_the_list_shows_failure_class_and_context(client_for, dead_letter):
    html = client_for("viewer").get(reverse("runs:dead_letters")).content.decode()

    assert f'data-letter="{dead_letter.pk}"' in html
    assert dead_letter.error_class in html
    assert dead_letter.sqlstate in html
    assert "rr_gone" in html  # the table named in the context
    assert "Replay same chunk" not in html  # a viewer gets no controls


def test_replay_puts_back_the_same_chunk(client_for, dead_letter):
    chunk = dead_letter.chunk
    identity = (chunk.run_id, chunk.tenant, chunk.key_from, chunk.key_to)

    response = post(
        client_for("oncall"),
        reverse("runs:replay", args=[dead_letter.pk]),
        {"reason": "table restored", "next": reverse("runs:dead_letters")},
    )

    dead_letter.refresh_from_db()
    chunk = Chunk.objects.get(pk=dead_letter.chunk_id)
    assert dead_letter.resolution == DeadLetter.Resolution.REPLAYED
    assert chunk.state == Chunk.State.PENDING
    assert (chunk.run_id, chunk.tenant, chunk.key_from, chunk.key_to) == identity
    assert "Replay dead letter" in response.content.decode()
    assert OperatorAction.objects.filter(action="dead_letter.replay", actor="oscar").exists()


def test_discard_records_the_reason(client_for, dead_letter):
    post(
        client_for("oncall"),
        reverse("runs:discard", args=[dead_letter.pk]),
        {"reason": "table retired"},
    )

    dead_letter.refresh_from_db()
    assert dead_letter.resolution == DeadLetter.Resolution.DISCARDED
    assert (dead_letter.resolved_by, dead_letter.resolution_reason) == ("oscar", "table retired")
    html = client_for("viewer").get(reverse("runs:dead_letters") + "?show=all").content.decode()
    assert "table retired" in html


def test_replaying_twice_says_it_is_already_replayed(client_for, dead_letter):
    client = client_for("oncall")
    url = reverse("runs:replay", args=[dead_letter.pk])
    post(client, url, {"reason": "first"})

    response = post(client, url, {"reason": "second"})

    assert "already replayed" in response.content.decode()


def test_the_run_page_lists_its_open_dead_letters_with_replay(client_for, dead_letter):
    html = (
        client_for("oncall").get(reverse("runs:detail", args=[dead_letter.run_id])).content.decode()
    )

    assert "undefined table" in html
    assert reverse("runs:replay", args=[dead_letter.pk]) in html


@pytest.fixture
def two_letters(db, make_user):
    from .conftest import make_dead_letter

    return [make_dead_letter(make_user, slug=s, rows=300) for s in ("gone", "lost")]


def test_bulk_replay_resolves_every_chosen_letter_with_one_reason(client_for, two_letters):
    page = reverse("runs:dead_letters")
    response = post(
        client_for("oncall"),
        reverse("runs:dead_letters_bulk"),
        {
            "letter": [str(x.pk) for x in two_letters],
            "action": "replay",
            "reason": "INC-8 restored",
        },
        page=page,
    )

    for letter in two_letters:
        letter.refresh_from_db()
        assert letter.resolution == DeadLetter.Resolution.REPLAYED
    row = OperatorAction.objects.get(action="dead_letter.replay_many")  # one row for the batch
    assert row.reason == "INC-8 restored"
    assert row.details["dead_letters"] == sorted(x.pk for x in two_letters)
    assert not OperatorAction.objects.filter(action="dead_letter.replay").exists()
    assert "2 dead letters" in response.content.decode()


def test_replay_all_matching_a_cause_takes_every_open_letter_of_it(client_for, two_letters):
    page = reverse("runs:dead_letters") + "?cause=42P01"
    html = client_for("oncall").get(page).content.decode()
    assert "All 2 open letters matching the filter" in html
    response = post(
        client_for("oncall"),
        reverse("runs:dead_letters_bulk"),
        {"scope": "matching", "cause": "42P01", "action": "replay", "reason": "INC-8 restored"},
        page=page,
    )
    assert "Replay: 2 dead letters" in response.content.decode()
    row = OperatorAction.objects.get(action="dead_letter.replay_many")
    assert row.details["dead_letters"] == sorted(x.pk for x in two_letters)
    other = post(
        client_for("oncall"),
        reverse("runs:dead_letters_bulk"),
        {"scope": "matching", "table": "rr_nothing", "action": "discard", "reason": "x"},
        page=page,
    )
    assert "no open dead letter matches" in other.content.decode()


def test_bulk_discard_refused_for_one_changes_none(client_for, two_letters, users):
    from runs.actions import discard_dead_letter

    discard_dead_letter(two_letters[1], actor=users["oncall"], reason="earlier")
    page = reverse("runs:dead_letters")
    response = post(
        client_for("oncall"),
        reverse("runs:dead_letters_bulk"),
        {"letter": [str(x.pk) for x in two_letters], "action": "discard", "reason": "INC-9"},
        page=page,
    )

    two_letters[0].refresh_from_db()
    assert two_letters[0].resolution == DeadLetter.Resolution.OPEN
    assert not OperatorAction.objects.filter(reason="INC-9").exists()
    assert "refused" in response.content.decode()


def test_bulk_without_a_reason_or_a_letter_changes_nothing(client_for, two_letters):
    page = reverse("runs:dead_letters")
    for data in (
        {"letter": [str(two_letters[0].pk)], "action": "replay", "reason": ""},
        {"action": "replay", "reason": "INC-10"},
    ):
        post(client_for("oncall"), reverse("runs:dead_letters_bulk"), data, page=page)
    two_letters[0].refresh_from_db()
    assert two_letters[0].resolution == DeadLetter.Resolution.OPEN
