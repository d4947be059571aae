#!/usr/bin/env python
"""Screenshots of each role's main page at 1024 and 1400 px, taken with Playwright (Debian's
chromium) from a running demo, into docs/img/:

    RETENTION_DEMO=1 .venv/bin/python manage.py demo
    RETENTION_DEMO=1 .venv/bin/python manage.py runserver 127.0.0.1:8765 --noreload &
    .venv/bin/python demo/screenshots.py http://127.0.0.1:8765 [RUN_ID]

| role (demo user) | main page |
|---|---|
| viewer (victor) | the overview |
| oncall (oscar) | the run page of RUN_ID (else the newest run) |
| compliance (carol) | the approvals queue |
| auditor (audrey) | the audit trail |

Files: ``role-<role>-<width>.png``. Each page must fit its width (no horizontal scroll).
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
PAGES = {
    "viewer": ("victor", "/"),
    "oncall": ("oscar", "/runs/{run}/"),
    "compliance": ("carol", "/policies/approvals/"),
    "auditor": ("audrey", "/runs/audit/"),
}


def main(base: str, run: str | None) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for role, (user, path) in PAGES.items():
            for width in (1024, 1400):
                context = browser.new_context(viewport={"width": width, "height": 900})
                page = context.new_page()
                page.goto(f"{base}/login/")
                page.fill("input[name=username]", user)
                page.fill("input[name=password]", f"{user}-demo")
                page.click("button[type=submit]")
                page.wait_for_selector(".who")
                if "{run}" in path and run is None:
                    page.goto(f"{base}/runs/")
                    href = page.locator("table a[href^='/runs/']").first.get_attribute("href")
                    run = href.strip("/").split("/")[-1]
                page.goto(base + path.format(run=run))
                page.wait_for_load_state("networkidle")
                scroll = page.evaluate("document.documentElement.scrollWidth")
                if scroll > width:
                    raise SystemExit(f"{role} at {width} px: the page is {scroll} px wide")
                target = OUT / f"role-{role}-{width}.png"
                page.screenshot(path=str(target), full_page=True)
                print(f"{target.relative_to(ROOT)}  {role} ({user}) {path.format(run=run)}")
                context.close()
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), sys.argv[2] if len(sys.argv) > 2 else None)
