"""axe-core (the engine, run in headless Chromium on each page) reports no violation on the
pages an operator, an auditor and compliance visit, the 403 page and the API's reference
(Swagger UI, with an operation open) included; no page logs a script error. The page loads
are counted in the test's output."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe

from retention.actions import place_hold
from tests.dashboard.test_browser import active_run  # noqa: F401 - fixtures
from tests.dashboard.test_browser_run_controls import watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = Axe()


def pages(run_id: int, hold_id: int) -> list[tuple[str, str]]:
    return [
        ("oncall", "/"),
        ("oncall", "/?policy=events"),
        ("oncall", f"/runs/{run_id}/"),
        ("oncall", "/runs/"),
        ("oncall", "/runs/dead-letters/"),
        ("oncall", "/runs/activity/"),
        ("viewer", "/policies/"),
        ("compliance", "/policies/events/"),
        ("compliance", "/policies/approvals/"),
        ("compliance", "/policies/holds/"),
        ("compliance", f"/policies/holds/{hold_id}/"),
        ("compliance", f"/policies/holds/{hold_id}/release/"),
        ("compliance", "/policies/events/v1/"),
        ("compliance", "/policies/events/v1/preview/"),
        ("compliance", "/policies/drafts/new/"),
        ("oncall", "/runs/targets/"),
        ("oncall", "/runs/targets/default/"),
        ("auditor", "/runs/audit/"),
        ("viewer", "/docs/runbook/"),
        ("viewer", "/tokens/"),
        ("viewer", "/runs/audit/"),  # a 403: the error page
        ("viewer", "/runs/999999999/"),  # a 404: the error page
        # /api/v1/docs: test_the_api_reference_has_no_violation_closed_or_open
    ]


def violations(page) -> list[str]:
    found = AXE.run(page).response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
        for v in found
    ]


def test_axe_finds_no_violation_on_any_page(browser, login, live_server, active_run, users):  # noqa: F811
    hold = place_hold(policy=active_run.policy, tenant="3", actor=users["compliance"],
                      reason="case 12")  # fmt: skip
    seen: dict[str, list[str]] = {}
    opened, errors = {}, {}
    visited = 0
    for role, path in pages(active_run.pk, hold.pk):
        if role not in opened:
            opened[role] = login(role)
            errors[role] = watch_console(opened[role])
        page = opened[role]
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        visited += 1
        found = violations(page)
        if found:
            seen[f"{role} {path}"] = found
    # the sign-in page, signed out
    signed_out = browser.new_context().new_page()
    errors[None] = watch_console(signed_out)
    signed_out.goto(f"{live_server.url}/login/")
    signed_out.wait_for_load_state("networkidle")
    visited += 1
    if found := violations(signed_out):
        seen["signed out /login/"] = found
    signed_out.context.close()  # the browser outlives the test (one per test process)
    print(f"axe-core: {visited} page loads checked")
    assert seen == {}, "\n".join(f"{k}: {v}" for k, v in seen.items())
    # the browser logs the 403 and 404 pages' own statuses; nothing else may be logged
    logged = {
        r: [m for m in e if "status of 403" not in m and "status of 404" not in m]
        for r, e in errors.items()
    }
    assert {role: e for role, e in logged.items() if e} == {}


def test_the_api_reference_has_no_violation_closed_or_open(login, live_server):  # noqa: F811
    page = login("viewer")
    errors = watch_console(page)
    page.goto(f"{live_server.url}/api/v1/docs")
    page.wait_for_selector("h3.opblock-tag")  # Swagger UI has rendered the schema
    assert page.locator("html").get_attribute("lang") == "en"
    assert violations(page) == []
    page.locator(".opblock-summary-control").first.click()  # one operation open
    page.wait_for_selector(".opblock-body .opblock-title")
    assert violations(page) == []
    assert errors == []
