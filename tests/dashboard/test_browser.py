"""The dashboard in headless Chromium (Debian's system browser driven by Playwright), one
user per role, against a live server on the test database.

Screenshots go to artifacts/ (test artifacts, not committed); UPDATE_DOC_SCREENSHOTS=1 refreshes docs/img/
for the runbook.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs a loop

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from core.models import OperatorAction
from retention import actions as retention_actions  # noqa: E402
from retention.models import PolicyVersion  # noqa: E402
from retention.spec import PolicySpec  # noqa: E402
from runs import planner, worker  # noqa: E402
from runs.actions import pause_run, trigger_run  # noqa: E402
from runs.models import Chunk, DeadLetter, Run  # noqa: E402
from tests.factories import events_spec  # noqa: E402
from tests.runs.conftest import NOW, create_events  # noqa: E402

from .conftest import make_dead_letter  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
DOC_IMAGES = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def login(browser, live_server, users):
    """``login("oncall")`` → a page signed in as that role's user."""
    contexts = []

    def open_as(role: str, user=None):
        user = user or users[role]
        context = browser.new_context(
            viewport={"width": 1400, "height": 1000}, accept_downloads=True
        )
        contexts.append(context)
        page = context.new_page()
        page.goto(f"{live_server.url}/login/")
        page.fill("input[name=username]", user.username)
        page.fill("input[name=password]", f"{user.username}-pw")
        page.click("button[type=submit]")
        expect(page.locator(".who")).to_contain_text(user.username)
        return page

    yield open_as
    for context in contexts:
        context.close()


def shoot(page, name: str) -> None:
    """Save a screenshot under artifacts/; with UPDATE_DOC_SCREENSHOTS=1 also refresh the
    runbook's copy under docs/img/."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, f"screenshot {name} looks empty"
    if os.environ.get("UPDATE_DOC_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOC_IMAGES / f"{name}.png")


@pytest.fixture
def active_run(make_user):
    from tests.factories import approved_policy

    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    run.refresh_from_db()
    return run


def test_the_overview_updates_while_a_run_drains(login, live_server, active_run):
    page = login("viewer")
    page.goto(f"{live_server.url}/")
    card = page.locator('[data-policy="events"]')
    expect(card.locator('[data-testid="policy-state"]')).to_have_text(re.compile("active", re.I))
    before = card.locator('[data-testid="progress"]').inner_text()
    assert "100%" not in before

    worker.drain(active_run.pk, budget_s=60)

    # no reload: the HTMX poll brings the new numbers
    expect(card.locator('[data-testid="progress"]')).to_contain_text("100%", timeout=15_000)
    expect(card.locator(".run-line .badge")).to_have_text(re.compile("drained", re.I))
    assert "Turn kill switch" not in page.content()  # a viewer has no controls
    shoot(page, "overview")


def test_oncall_pauses_and_resumes_from_the_run_page(login, live_server, active_run):
    page = login("oncall")
    page.goto(f"{live_server.url}/runs/{active_run.pk}/")
    expect(page.locator('[data-testid="run-state"]')).to_have_text(re.compile("active", re.I))
    shoot(page, "run-page")

    page.fill('input[aria-label="reason to pause"]', "INC-31 lock waits on orders")
    page.click('[data-testid="pause"]')
    expect(page.locator(".messages")).to_contain_text("Pause run")
    expect(page.locator('[data-testid="run-state"]')).to_have_text(re.compile("paused", re.I))

    page.fill('input[aria-label="reason to resume"]', "INC-31 mitigated")
    page.click('[data-testid="resume"]')
    expect(page.locator('[data-testid="run-state"]')).to_have_text(re.compile("active", re.I))
    active_run.refresh_from_db()
    assert active_run.state == Run.State.ACTIVE
    assert list(
        OperatorAction.objects.filter(target_id=str(active_run.pk), actor="oscar")
        .order_by("at")
        .values_list("action", flat=True)
    ) == ["run.pause", "run.resume"]


def test_oncall_replays_a_dead_letter(login, live_server, make_user):
    letter = make_dead_letter(make_user, slug="gone", rows=300)
    page = login("oncall")
    page.goto(f"{live_server.url}/runs/dead-letters/")
    entry = page.locator(f'[data-letter="{letter.pk}"]')
    expect(entry).to_contain_text("undefined table")
    shoot(page, "dead-letters")

    entry.locator('input[aria-label="reason to replay"]').fill("table restored from backup")
    entry.locator('[data-testid="replay"]').click()

    expect(page.locator(".messages")).to_contain_text(f"Replay dead letter #{letter.pk}")
    expect(page.locator('[data-testid="no-dead-letters"]')).to_be_visible()
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.REPLAYED
    assert Chunk.objects.get(pk=letter.chunk_id).state == Chunk.State.PENDING


def test_a_version_is_approved_by_a_different_compliance_officer(
    login, live_server, users, make_user
):
    create_events(300)
    author = users["compliance"]
    version = retention_actions.apply_spec(PolicySpec.parse(events_spec()), author=author)
    version = retention_actions.submit_version(version, actor=author, reason="new policy")
    url = f"{live_server.url}/policies/events/v{version.number}/"

    own = login("compliance")
    own.goto(url)
    expect(own.locator("body")).to_contain_text("another member of compliance must approve")
    assert own.locator("text=Approve v1").count() == 0

    other = login("compliance", user=make_user("cora", "compliance"))
    other.goto(url)
    other.locator('form[action$="/approve/"] input[name=reason]').fill("reviewed with legal")
    other.locator('form[action$="/approve/"] button').click()
    expect(other.locator("h1 .badge")).to_have_text("approved")
    shoot(other, "approved-version")
    version.refresh_from_db()
    assert version.state == PolicyVersion.State.APPROVED
    assert (version.author.username, version.decided_by.username) == ("carla", "cora")


def test_an_auditor_downloads_the_csv_export(login, live_server, active_run, tmp_path):
    page = login("auditor")
    page.goto(f"{live_server.url}/runs/audit/?run={active_run.pk}")
    expect(page.locator("table.compact tbody tr")).to_have_count(3)
    shoot(page, "audit")

    with page.expect_download() as info:
        page.click('[data-testid="export-csv"]')
    download = info.value
    target = tmp_path / download.suggested_filename
    download.save_as(target)

    lines = target.read_text().splitlines()
    assert lines[0].startswith("chain_seq,committed_at")
    assert len(lines) == 1 + 3
    assert download.suggested_filename == f"audit_{active_run.pk}.csv"


def test_the_incident_drill_takes_at_most_two_clicks_per_question(
    login, live_server, active_run, users
):
    """From the alert link: schedule window, the run, its last committed progress, whether a
    delivery is pending or dead-lettered, and resuming the same run."""
    pause_run(active_run, actor=users["oncall"], reason="INC-40 replica lag")
    page = login("oncall")
    clicks = 0

    def click(selector: str) -> None:
        nonlocal clicks
        clicks += 1
        page.click(selector)

    page.goto(f"{live_server.url}/?policy=events")  # the alert link: zero clicks
    card = page.locator('[data-policy="events"]')
    expect(card.locator('[data-testid="policy-state"]')).to_have_text(re.compile("paused", re.I))
    shoot(page, "drill-1-alert")

    click('[data-policy="events"] [data-testid="run-link"]')  # 1: the run
    expect(page).to_have_url(f"{live_server.url}/runs/{active_run.pk}/")
    window = page.locator('[data-testid="schedule-window"]')
    expect(window).to_contain_text(active_run.cutoff.strftime("%Y-%m-%d %H:%M:%S"))
    expect(window).to_contain_text(active_run.tick.strftime("%Y-%m-%d %H:%M:%S"))
    expect(page.locator('[data-testid="last-commit"]')).to_contain_text("rows, committed")
    delivery = page.locator('[data-testid="delivery"]')
    pending = active_run.chunks.filter(state="pending").count()
    expect(delivery).to_contain_text(f"{pending} pending chunk(s)")
    expect(delivery).to_contain_text("0 dead-lettered")
    expect(page.locator('[data-testid="no-dead-letters"]')).to_be_visible()
    shoot(page, "drill-2-run")
    assert clicks == 1

    page.fill('input[aria-label="reason to resume"]', "INC-40 lag back under 2 s")
    click('[data-testid="resume"]')  # 2: resume the same run
    expect(page.locator('[data-testid="run-state"]')).to_have_text(re.compile("active", re.I))
    shoot(page, "drill-3-resumed")
    assert clicks == 2
    assert Run.objects.filter(policy=active_run.policy).count() == 1
    resumed = Run.objects.get(pk=active_run.pk)
    assert (resumed.state, resumed.run_key, resumed.cutoff) == (
        Run.State.ACTIVE,
        active_run.run_key,
        active_run.cutoff,
    )


def test_oncall_flips_the_global_kill_switch_with_a_reason(login, live_server, active_run):
    from retention.models import KillSwitch

    page = login("oncall")
    page.goto(f"{live_server.url}/")
    page.click("#kill-switch-form summary")
    page.fill('#kill-switch-form input[name="reason"]', "INC-52 primary at 95% CPU")
    page.click("#kill-switch-form button[type=submit]")

    expect(page.locator('[data-testid="kill-switch-on"]')).to_contain_text(
        "INC-52 primary at 95% CPU"
    )
    assert KillSwitch.is_on()
    shoot(page, "kill-switch")

    page.fill('#kill-switch-form input[name="reason"]', "INC-52 over")
    page.click("#kill-switch-form button[type=submit]")
    expect(page.locator('[data-testid="kill-switch-on"]')).to_have_count(0)
    assert not KillSwitch.is_on()
