"""The live preview of a candidate version says what changes against the approved one."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from retention import actions
from retention.schedule_math import latest_tick
from retention.spec import PolicySpec
from tests.factories import events_spec
from tests.runs.conftest import count

pytestmark = pytest.mark.django_db


def _would_delete(spec: PolicySpec) -> int:
    cutoff = spec.cutoff_for(latest_tick(spec, timezone.now()))
    return count("public.rr_events", "occurred_at < %s AND status <> 'disputed'", [cutoff])


def test_the_preview_of_a_candidate_shows_the_approved_versions_count_beside_it(
    events_policy, users, client_for
):
    approved = events_policy.versions.get(state="approved")
    spec = PolicySpec.parse(events_spec(retention="10 days"))
    candidate = actions.apply_spec(spec, author=users["compliance"])
    candidate = actions.submit_version(candidate, actor=users["compliance"], reason="shorter")

    url = reverse("retention:version_preview", args=["events", candidate.number])
    html = client_for("compliance").get(url).content.decode()

    new, old = _would_delete(spec), _would_delete(approved.parsed)
    assert new > old > 0
    assert (
        f'<p data-testid="preview-compare">v{candidate.number} deletes <strong>{new:,}</strong> '
        f"rows; v{approved.number} (approved) would delete <strong>{old:,}</strong> today.</p>"
    ) in html


def test_the_preview_of_the_approved_version_compares_with_nothing(events_policy, client_for):
    approved = events_policy.versions.get(state="approved")

    url = reverse("retention:version_preview", args=["events", approved.number])
    html = client_for("compliance").get(url).content.decode()

    assert 'data-testid="preview-compare"' not in html
    assert f'data-eligible="{_would_delete(approved.parsed)}"' in html
