"""The blast-radius baseline: a version's first run compares against the preview its
approver saw; later runs of that version against its previous drained run."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client

from runs.actions import trigger_run
from runs.engine import worker
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events


def rows_deleted(run) -> int:
    from django.db.models import Sum

    return int(run.audit_records.aggregate(s=Sum("rows_deleted"))["s"] or 0)


def _drained_first_version(make_user):
    create_events(40_000, days=40)
    policy = approved_policy(make_user, **events_spec(retention="38 days"))
    first, _ = trigger_run(policy, tick=NOW)
    assert first.state == Run.State.ACTIVE, first.state_reason
    worker.drain(first.pk, budget_s=120)
    first.refresh_from_db()
    assert first.state == Run.State.DRAINED, first.state_reason
    assert 0 < rows_deleted(first) < 3_000
    return policy


def test_the_first_run_of_a_new_version_compares_against_its_approved_preview(db, make_user):
    policy = _drained_first_version(make_user)
    policy = approved_policy(make_user, **events_spec(retention="10 days"))  # 38 → 10 days
    version = policy.approved_version
    assert version.number == 2
    assert version.preview["eligible"] > 20_000  # the approver saw and approved these rows
    run, _ = trigger_run(policy, tick=NOW + timedelta(days=1))
    assert run.policy_version_id == version.pk
    assert run.state == Run.State.ACTIVE, run.state_reason


def test_a_later_run_of_the_version_is_held_against_its_previous_run_with_the_full_reason(
    db, make_user
):
    policy = _drained_first_version(make_user)
    first = Run.objects.get(policy=policy)
    baseline = rows_deleted(first)
    # same version, later tick: a large burst of old rows arrives
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_events SELECT 1000000 + g, 2, %s, 'closed', 'x'"
            " FROM generate_series(1, 20000) AS g",
            [NOW - timedelta(days=60)],
        )
    run, _ = trigger_run(policy, tick=NOW + timedelta(days=1))
    assert run.state == Run.State.CONFIRM
    assert f"the baseline of {baseline:,}" in run.state_reason
    assert f"previous run {first.run_key}" in run.state_reason
    # the reason is shown whole where the run is listed
    viewer = make_user("vera", "viewer")
    client = Client()
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert run.state_reason in page


def test_a_new_version_far_over_its_own_preview_is_held_naming_the_preview(db, make_user):
    policy = _drained_first_version(make_user)
    policy = approved_policy(make_user, **events_spec(retention="30 days"))
    version = policy.approved_version
    from django.db import connection

    # the preview counted the rows older than 30 days before the wall clock's latest tick: the
    # later the clock is past NOW, the more of the table's 40 days that is. The burst is sized
    # from it, so that it is far over 3× the preview whatever today is.
    burst = max(40_000, 4 * version.preview["eligible"])
    with connection.cursor() as cur:  # after approval, a burst far over the approved preview
        cur.execute(
            "INSERT INTO public.rr_events SELECT 1000000 + g, 2, %s, 'closed', 'x'"
            " FROM generate_series(1, %s) AS g",
            [NOW - timedelta(days=60), burst],
        )
    run, _ = trigger_run(policy, tick=NOW + timedelta(days=1))
    assert run.state == Run.State.CONFIRM
    assert f"the baseline of {version.preview['eligible']:,}" in run.state_reason
    assert f"v{version.number}'s approved preview" in run.state_reason
