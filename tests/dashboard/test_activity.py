from __future__ import annotations

import pytest
from django.urls import reverse

from runs.actions import pause_run, resume_run

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
