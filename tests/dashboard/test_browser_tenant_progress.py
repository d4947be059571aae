"""Per-tenant progress on the run page, in headless Chromium, for chunks across tenants (key
ranges, what ``auto`` picks for interleaved tenants) and per tenant: each tenant's deleted
rows, the rows a hold defers, chunks only where chunks are a tenant's, and a short table with
many tenants (docs/runbook.md, "Run page")."""

from __future__ import annotations

import pytest
from django.db import connection
from playwright.sync_api import expect

from retention.actions import place_hold
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def deleted_by_tenant() -> dict[str, int]:
    """Rows gone from rr_events, per tenant, counted against its shadow copy."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT s.tenant_id::text, count(*) FROM public.rr_events_shadow s"
            " WHERE NOT EXISTS (SELECT 1 FROM public.rr_events e WHERE e.id = s.id)"
            " GROUP BY 1"
        )
        return dict(cur.fetchall())


def drained_run(make_user, users, *, chunking: str, tenants: int, rows: int, hold: str | None):
    create_events(rows, tenants=tenants)
    policy = approved_policy(make_user, **events_spec(chunking=chunking))
    if hold:
        place_hold(policy=policy, tenant=hold, actor=users["compliance"], reason="case 12")
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    worker.drain(run.pk, budget_s=120)
    run = Run.objects.get(pk=run.pk)
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def cell(row, column: str) -> int:
    return int(row.locator(f'[data-col="{column}"]').inner_text().replace(",", "") or 0)


@pytest.mark.parametrize("chunking", ["key", "tenant"])
def test_each_tenant_shows_its_deleted_and_held_rows_for_every_geometry(
    login,  # noqa: F811
    live_server,
    make_user,
    users,
    chunking,
):
    run = drained_run(make_user, users, chunking=chunking, tenants=5, rows=3000, hold="3")
    assert run.chunking == chunking
    expected = deleted_by_tenant()
    deferred = run.verification["deferred_by_holds"]
    assert deferred > 0 and "3" not in expected

    page = login("viewer")
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    table = page.locator('[data-testid="tenant-progress"]')
    expect(table).to_be_visible()
    shown = {
        row.get_attribute("data-tenant"): row for row in table.locator("tr[data-tenant]").all()
    }
    assert set(shown) == {"1", "2", "3", "4", "5"}, set(shown)
    for tenant, row in shown.items():
        assert cell(row, "deleted") == expected.get(tenant, 0), tenant
    assert cell(shown["3"], "deferred") == deferred
    text = table.inner_text()
    assert "(all)" not in text
    if chunking == "key":  # chunks are the run's, not a tenant's: no per-tenant chunk column
        assert "0/0" not in text
        assert table.locator('[data-col="chunks"]').count() == 0
    else:
        done = sum(
            int(r.locator('[data-col="chunks"]').inner_text().split("/")[0]) for r in shown.values()
        )
        assert done == run.chunks.filter(state="done").count()


def test_fifty_tenants_show_the_top_ones_and_the_others_in_one_row(
    login,  # noqa: F811
    live_server,
    make_user,
    users,
):
    run = drained_run(make_user, users, chunking="key", tenants=91, rows=6000, hold=None)
    expected = deleted_by_tenant()
    assert len(expected) > 50

    page = login("viewer")
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    table = page.locator('[data-testid="tenant-progress"]')
    rows = table.locator("tr[data-tenant]").all()
    assert len(rows) <= 10
    others = table.locator("tr[data-tenant-others]")
    expect(others).to_contain_text(f"{len(expected) - len(rows)} others")
    total = sum(cell(r, "deleted") for r in rows) + cell(others, "deleted")
    assert total == sum(expected.values())
    top = sorted(expected.values(), reverse=True)[: len(rows)]
    assert sorted((cell(r, "deleted") for r in rows), reverse=True) == top
