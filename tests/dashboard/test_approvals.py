"""The approval queue of compliance: versions submitted by someone else, with the submitter's
reason, the changed fields, the preview's count and links to the diff and preview; never
decidable by their author or submitter; decisions go through the approval actions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from core.models import OperatorAction
from retention import actions as retention_actions
from retention.models import PolicyVersion
from retention.spec import PolicySpec
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import create_events

from .helpers import post

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitted(db, make_user, users) -> PolicyVersion:
    """events v1 approved; v2 (30 days) written and submitted by carla with a reason."""
    create_events(600)
    approved_policy(make_user, **events_spec())
    carla = users["compliance"]
    draft = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(retention="30 days")), author=carla
    )
    return retention_actions.submit_version(draft, actor=carla, reason="legal asked for 30 days")


def test_the_queue_shows_another_persons_submission_with_reason_diff_and_preview(
    client_for, submitted, make_user
):
    cora = make_user("cora", "compliance")
    client = client_for("compliance")
    client.force_login(cora)
    html = client.get(reverse("retention:approvals")).content.decode()

    card = html.split(f'data-approval="events-v{submitted.number}"', 1)[1].split("</section>")[0]
    assert "“legal asked for 30 days”" in card
    assert "<code>retention</code>" in card  # the changed field
    assert f"{submitted.preview['eligible']:,}" in card
    assert reverse("retention:version_detail", args=["events", submitted.number]) in card
    assert reverse("retention:version_preview", args=["events", submitted.number]) in card
    assert 'data-testid="approve"' in card


def test_the_submitter_sees_their_own_version_but_cannot_decide_on_it(client_for, submitted):
    html = client_for("compliance").get(reverse("retention:approvals")).content.decode()

    assert 'data-testid="queue-empty"' in html  # nothing awaits carla's own decision
    card = html.split(f'data-approval="events-v{submitted.number}"', 1)[1].split("</section>")[0]
    assert 'data-testid="approve"' not in card and 'data-testid="not-yours"' in card


def test_approving_from_the_queue_goes_through_the_action_and_comes_back(
    client_for, submitted, make_user
):
    client = client_for("compliance")
    client.force_login(make_user("cora", "compliance"))
    queue = reverse("retention:approvals")
    url = reverse("retention:version_approve", args=["events", submitted.number])

    refused = post(client, url, {"reason": "", "password": "cora-pw", "next": queue}, page=queue)
    submitted.refresh_from_db()
    assert submitted.state == PolicyVersion.State.SUBMITTED
    assert "reason" in refused.content.decode()

    done = post(client, url, {"reason": "checked with legal", "next": queue}, page=queue)
    assert done.redirect_chain[-1][0] == queue
    submitted.refresh_from_db()
    assert (submitted.state, submitted.decided_by.username) == ("approved", "cora")
    assert OperatorAction.objects.filter(
        action="version.approve", target_id=str(submitted.pk), actor="cora"
    ).exists()
    assert 'data-testid="queue-empty"' in done.content.decode()


def test_the_submitter_posting_an_approval_is_refused(client_for, submitted):
    client = client_for("compliance")
    queue = reverse("retention:approvals")
    url = reverse("retention:version_approve", args=["events", submitted.number])

    post(client, url, {"reason": "self-approval", "next": queue}, page=queue)
    submitted.refresh_from_db()
    assert submitted.state == PolicyVersion.State.SUBMITTED


def test_the_diff_against_the_previous_approval_stays_visible_after_approval(
    client_for, submitted, make_user
):
    retention_actions.approve_version(submitted, actor=make_user("cora", "compliance"), reason="ok")
    html = (
        client_for("viewer")
        .get(reverse("retention:version_detail", args=["events", submitted.number]))
        .content.decode()
    )

    assert f"against the previously approved v{submitted.number - 1}" in html
    assert 'data-field="retention"' in html and "30 days" in html and "20 days" in html


def test_the_version_page_shows_the_submit_reason_beside_the_diff(client_for, submitted):
    html = (
        client_for("viewer")
        .get(reverse("retention:version_detail", args=["events", submitted.number]))
        .content.decode()
    )
    assert 'data-testid="submit-reason"' in html and "legal asked for 30 days" in html


def test_the_card_shows_each_changed_value_and_what_each_version_would_delete_today(
    client_for, make_user, users
):
    """A shorter retention deletes more: both counts are taken now, on the same table, so
    the second person compares like with like (not v1's preview from before v1's run)."""
    from django.db import connection

    create_events(600)
    approved_policy(make_user, **events_spec())
    carla = users["compliance"]
    draft = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(retention="10 days")), author=carla
    )
    v2 = retention_actions.submit_version(draft, actor=carla, reason="legal asked for 10 days")
    with connection.cursor() as cur:  # v1's run happened since: its rows are gone
        cur.execute(
            "DELETE FROM public.rr_events WHERE occurred_at < now() - interval '20 days'"
            " AND status IS DISTINCT FROM 'disputed'"
        )
    cora = make_user("cora", "compliance")
    client = client_for("compliance")
    client.force_login(cora)
    html = client.get(reverse("retention:approvals")).content.decode()
    card = html.split(f'data-approval="events-v{v2.number}"')[1].split("</section>")[0]

    assert "<code>retention</code>: 20 days → 10 days" in card
    now = card.split('data-testid="eligible-now"')[1].split("</dd>")[0]
    v2_now = int(now.split('data-count="new">')[1].split("<")[0].replace(",", ""))
    v1_now = int(now.split('data-count="base">')[1].split("<")[0].replace(",", ""))
    assert v2_now > v1_now  # the shorter retention deletes more, today
    assert "v1's preview" not in card
