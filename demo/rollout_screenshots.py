#!/usr/bin/env python
"""The screenshots of docs/policies.md, "Rolling out a policy", taken with Playwright (Debian's
chromium) from a demo database, into docs/img/:

    RETENTION_DEMO=1 .venv/bin/python manage.py demo --rows 100000
    RETENTION_DEMO=1 .venv/bin/python demo/rollout_screenshots.py --prepare
    RETENTION_DEMO=1 .venv/bin/python manage.py runserver 127.0.0.1:8765 --noreload &
    .venv/bin/python demo/rollout_screenshots.py http://127.0.0.1:8765

``--prepare`` acts through the product's own actions: oscar triggers two count runs of
``orders`` a day apart and a slice run of ``renewal-reminders``, a worker drains them here,
and alice writes and submits ``orders`` with ``rollout = "slice"`` (the promotion carol
decides on). The screenshots (1400 px wide):

| file | page |
|---|---|
| ``rollout-count-run.png`` | the newest counted run of ``orders`` (oscar) |
| ``rollout-approval.png`` | the approvals queue with the count → slice card (carol) |
| ``rollout-slice-run.png`` | the slice run of ``renewal-reminders`` (oscar) |
| ``rollout-history.png`` | the policy page of ``orders``: its rollout history (carol) |
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]


def prepare() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # Django's settings and app registry: only this mode needs them
    import django

    django.setup()
    # the product's modules and Django's: importable once the app registry is ready
    from django.contrib.auth.models import User
    from django.utils import timezone

    # the product's actions, as the demo command uses them
    from retention import actions
    from retention.models import Policy
    from retention.schedule_math import latest_tick
    from retention.spec import PolicySpec
    from runs.actions import trigger_run
    from runs.engine import worker

    oscar, alice = User.objects.get(username="oscar"), User.objects.get(username="alice")
    now = timezone.now()
    orders = Policy.objects.get(slug="orders")
    reminders = Policy.objects.get(slug="renewal-reminders")
    ticks = [
        (orders, latest_tick(orders, now - timedelta(days=1))),
        (orders, latest_tick(orders, now)),
    ]
    ticks.append((reminders, latest_tick(reminders, now)))
    for policy, tick in ticks:
        run, _ = trigger_run(policy, tick=tick, source="manual", actor=oscar)
        while worker.drain(run.pk, budget_s=60, until_idle=True)["continue"]:
            pass
        run.refresh_from_db()
        print(f"{run.run_key}: {run.state} — {run.state_reason}")
    spec = PolicySpec.from_json(orders.approved_version.spec).to_json()
    spec.update(rollout="slice", slice="180 days")
    draft = actions.apply_spec(PolicySpec.from_json(spec), author=alice)
    if draft.state == "draft":
        actions.submit_version(
            draft, actor=alice, reason="the counts match the preview; slice next"
        )
    print(f"orders v{draft.number} submitted")


def shoot(base: str) -> None:
    # a browser driver: only this mode needs it
    from playwright.sync_api import sync_playwright

    pages = [
        ("rollout-count-run", "oscar", "/runs/?policy=orders", "count"),
        ("rollout-approval", "carol", "/policies/approvals/", None),
        ("rollout-slice-run", "oscar", "/runs/?policy=renewal-reminders", "slice"),
        ("rollout-history", "carol", "/policies/orders/#rollout", None),
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for name, user, path, run_of in pages:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.goto(f"{base}/login/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", f"{user}-demo")
            page.click("button[type=submit]")
            page.wait_for_selector(".who")
            page.goto(base + path)
            if run_of is not None:  # the newest run of the policy
                href = page.locator("table a[href^='/runs/']").first.get_attribute("href")
                page.goto(base + href)
            page.wait_for_load_state("networkidle")
            target = OUT / f"{name}.png"
            page.screenshot(path=str(target), full_page=True)
            print(f"{target.relative_to(ROOT)}  {user} {page.url}")
            context.close()
        browser.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--prepare"]:
        prepare()
    else:
        shoot(sys.argv[1].rstrip("/"))
