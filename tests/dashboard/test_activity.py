from __future__ import annotations

import re

import pytest
from django.urls import reverse

from runs.actions import pause_run, resume_run

from .conftest import make_dead_letter

pytestmark = pytest.mark.django_db


def test_the_activity_page_lists_operator_actions_and_filters_them(client_for, run, users):
    pause_run(run, actor=users["oncall"], reason="INC-1 lock waits")
    resume_run(run, actor=users["oncall"], reason="INC-1 over")
    client = client_for("viewer")

    everything = client.get(reverse("runs:activity")).content.decode()
    pauses = client.get(reverse("runs:activity") + "?action=run.pause").content.decode()
    by_oscar = client.get(reverse("runs:activity") + "?actor=oscar").content.decode()
    by_nobody = client.get(reverse("runs:activity") + "?actor=nobody").content.decode()

    assert "INC-1 lock waits" in everything and "INC-1 over" in everything
    assert "version.approve" in everything
    assert "INC-1 lock waits" in pauses and "INC-1 over" not in pauses
    assert (
        'data-action="run.resume"' in by_oscar and 'data-action="version.approve"' not in by_oscar
    )
    assert "No action recorded." in by_nobody


def test_activity_filters_by_run_and_policy_and_names_its_targets(
    client_for, run, users, make_user
):
    pause_run(run, actor=users["oncall"], reason="INC-1 lock waits")
    letter = make_dead_letter(make_user, slug="gone", rows=300)
    client = client_for("viewer")
    url = reverse("runs:activity")

    by_run = client.get(url, {"run": run.run_key}).content.decode()
    by_id = client.get(url, {"run": str(run.pk)}).content.decode()
    by_policy = client.get(url, {"policy": "events"}).content.decode()

    for html in (by_run, by_id):
        assert 'data-action="run.pause"' in html and 'data-action="version.approve"' not in html
        assert f">{run.run_key}</a>" in html  # the run's key, not "run 9"
    assert 'data-action="run.pause"' in by_policy and 'data-action="version.approve"' in by_policy
    assert f"run {letter.run_id}<" not in by_policy and "gone/" not in by_policy
    assert "policyversion " not in by_policy
    assert f"events v{run.policy_version.number}" in by_policy


def test_an_unknown_run_or_policy_filter_is_an_error_not_an_unfiltered_list(client_for, run):
    client = client_for("viewer")
    for query in ({"run": "no-such-run"}, {"policy": "no-such-policy"}):
        response = client.get(reverse("runs:activity"), query)
        assert response.status_code == 400, query
        html = response.content.decode()
        assert "No action recorded." in html and 'data-action="' not in html


def test_activity_details_read_as_key_value_with_formatted_numbers_not_raw_json(
    client_for, run, users
):
    from core.oplog import record_action

    record_action(
        users["oncall"],
        "run.next_pass",
        run,
        reason="rows remain",
        **{"pass": 2, "remaining": 325867, "split": {"from": 12004, "into": [6000, 6004]}},
        note=None,
    )

    html = client_for("viewer").get(reverse("runs:activity") + "?action=run.next_pass")
    row = html.content.decode().split('data-action="run.next_pass"')[1].split("</tr>")[0]
    cell = re.sub(r"<[^>]+>", " ", row.split('<td class="small">')[1])
    cell = re.sub(r"\s+", " ", cell)

    assert "remaining: 325,867" in cell
    assert "pass: 2" in cell
    assert "split from: 12,004" in cell and "split into: 6,000, 6,004" in cell
    assert "note: —" in cell
    assert "{" not in cell and "=" not in cell and "None" not in cell
