"""The preview and the run page of a policy on a partitioned table, in headless Chromium:
each partition with its bounds, rows, kept and held rows and the action a run takes; the run
page lists the partitions it dropped beside its chunks. Screenshot ``preview-partitions``
(docs/policies.md, "Partitioned tables"; UPDATE_DOC_SCREENSHOTS=1 refreshes docs/img/)."""

from __future__ import annotations

import pytest
from django.db import connection
from playwright.sync_api import expect

from runs.actions import trigger_run
from runs.engine import worker
from tests.dashboard.test_browser import shoot
from tests.dashboard.test_browser_axe import violations
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW
from tests.runs.test_partitions import MONTHS, create_partitioned

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def parts_policy(make_user, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned()
    yield approved_policy(
        make_user,
        **events_spec(
            slug="parts", table="rr_parts", retention="120 days", name="Parts older than 120 days"
        ),
    )
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def test_the_preview_shows_each_partition_and_the_run_page_what_was_dropped(
    login,
    live_server,
    parts_policy,
):
    page = login("viewer")
    version = parts_policy.versions.get(state="approved")
    page.goto(f"{live_server.url}/policies/parts/v{version.number}/")
    table = page.locator("[data-partitions]").first
    expect(table).to_be_visible()
    expect(table.locator("tr", has_text="rr_parts_2026_01")).to_contain_text("drop")
    expect(table.locator("tr", has_text="rr_parts_2026_03")).to_contain_text("kept")
    expect(table.locator("tr", has_text="rr_parts_2026_08")).to_contain_text("straddles")
    table.scroll_into_view_if_needed()
    shoot(page, "preview-partitions")
    assert violations(page) == []  # axe-core, as on every page (test_browser_axe.py)

    run, _ = trigger_run(parts_policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator('[data-testid="partition-actions"]')
    expect(actions.locator('[data-partition="public.rr_parts_2026_01"]')).to_contain_text("dropped")
    expect(actions.locator('[data-partition="public.rr_parts_2026_01"]')).to_contain_text("md5:")
    assert violations(page) == []
