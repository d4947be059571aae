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

from playwright.sync_api import expect  # noqa: E402

from core.models import OperatorAction
from retention import actions as retention_actions  # noqa: E402
from retention.models import PolicyVersion  # noqa: E402
from retention.spec import PolicySpec  # noqa: E402
from runs.actions import pause_run, trigger_run  # noqa: E402
from runs.engine import planner, worker  # noqa: E402
from runs.models import Chunk, DeadLetter, Run  # noqa: E402
from tests.browser import beats, open_on_a_clock  # noqa: E402
from tests.factories import events_spec  # noqa: E402
from tests.runs.conftest import NOW, create_events  # noqa: E402

from .conftest import make_dead_letter  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
DOC_IMAGES = ROOT / "docs" / "img"


def test_a_person_signs_in_through_the_form(browser, live_server, users):
    user = users["oncall"]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{live_server.url}/runs/activity/")
        expect(page).to_have_url(re.compile(r"/login/\?next="))  # no session: sign in first
        page.fill("input[name=username]", user.username)
        page.fill("input[name=password]", f"{user.username}-pw")
        page.click("button[type=submit]")
        expect(page).to_have_url(f"{live_server.url}/runs/activity/")
        expect(page.locator(".who")).to_contain_text(user.username)
    finally:
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
def active_run(make_user, settings):
    from tests.factories import approved_policy

    # three chunks done, whatever the guard would make of a machine busy with other tests
    # (its verdicts have tests of their own)
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
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
    open_on_a_clock(page, f"{live_server.url}/")
    card = page.locator('[data-policy="events"]')
    expect(card.locator('[data-testid="policy-state"]')).to_have_text(re.compile("active", re.I))
    before = card.locator('[data-testid="progress"]').inner_text()
    assert "100%" not in before

    worker.drain(active_run.pk, budget_s=60)

    # no reload: the HTMX poll brings the new numbers
    beats(page, 1)
    expect(card.locator('[data-testid="progress"]')).to_contain_text("100%")
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


def test_the_run_page_says_whether_the_run_kept_the_foregrounds_budget(
    login, live_server, active_run
):
    from django.utils import timezone

    from runs.engine import guard
    from runs.models import GuardControlStep

    def step(action: str, inflation: float) -> None:
        GuardControlStep.objects.create(
            policy_id=active_run.policy_id, taken_at=timezone.now(), concurrency=1, chunk_ms=50,
            duty_cycle=0.1, inflation=inflation, budget=1.5, action=action, reason="",
        )  # fmt: skip

    GuardControlStep.objects.all().delete()
    assert active_run.started_at is not None
    step(guard.INCREASE, 1.2)
    page = login("viewer")
    open_on_a_clock(page, f"{live_server.url}/runs/{active_run.pk}/")
    line = page.locator('[data-testid="guard-over-run"]')
    expect(line).to_have_text(
        "Foreground budget over this run: within the budget in the 1 period judged"
        " (worst 1.2 × idle, budget 1.5 ×)."
    )
    step(guard.FLOOR, 4.5)
    # no reload: the page's live part brings the run's new verdict
    beats(page, 1)
    expect(line).to_contain_text(
        "over the budget at the controller's minimum in 1 of 2 periods judged (worst 4.5 × idle"
    )


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
    # approving asks for the password again (sudo mode)
    other.locator('form[action$="/approve/"] input[name=password]').fill("cora-pw")
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
    # one run's trail is named by its run key (events/2026-11-30T12:00 → events-2026-11-30T12-00)
    stem = active_run.run_key.replace("/", "-").replace(":", "-")
    assert download.suggested_filename == f"{stem}.csv"


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
    page.on("dialog", lambda dialog: dialog.accept())  # turning it on asks first
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


# -- role workflows, stale controls, dead ends -----------------------------------


@pytest.fixture
def submitted_version(users, make_user):
    """events v1 approved; v2 (30 days) written and submitted by carla, with a reason."""
    from tests.factories import approved_policy

    create_events(3000, tenants=12)
    approved_policy(make_user, **events_spec())
    carla = users["compliance"]
    draft = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(retention="30 days")), author=carla
    )
    return retention_actions.submit_version(draft, actor=carla, reason="legal asked for 30 days")


def test_compliance_approves_from_the_queue_but_not_their_own(
    login, live_server, submitted_version, make_user
):
    card = f'[data-approval="events-v{submitted_version.number}"]'
    own = login("compliance")
    own.goto(f"{live_server.url}/policies/approvals/")
    expect(own.locator('[data-testid="queue-empty"]')).to_be_visible()
    expect(own.locator(card).locator('[data-testid="not-yours"]')).to_be_visible()
    assert own.locator(card).locator('[data-testid="approve"]').count() == 0

    for width in (1024, 1400):
        page = login("compliance", user=make_user(f"cora{width}", "compliance"), width=width)
        page.goto(f"{live_server.url}/policies/approvals/")
        entry = page.locator(card)
        expect(entry.locator('[data-testid="submit-reason"]')).to_contain_text(
            "legal asked for 30 days"
        )
        expect(entry.locator('[data-testid="diff-link"]')).to_be_visible()
        assert_no_horizontal_overflow(page)
        shoot(page, f"approvals-{width}")

    entry.locator('input[name="reason"]').first.fill("checked with legal")
    entry.locator('[data-testid="reauth-password"]').fill("cora1400-pw")  # asked again
    entry.locator('[data-testid="approve"]').click()
    expect(page.locator(".messages")).to_contain_text("approved")
    expect(page.locator('[data-testid="queue-empty"]')).to_be_visible()
    submitted_version.refresh_from_db()
    assert submitted_version.state == PolicyVersion.State.APPROVED
    assert submitted_version.decided_by.username == "cora1400"


def test_a_stale_resume_is_refused_with_the_current_state(
    login, live_server, active_run, users, make_user
):
    pause_run(active_run, actor=users["oncall"], reason="INC-1 replica lag")
    page = login("oncall")
    page.goto(f"{live_server.url}/runs/{active_run.pk}/")
    # typing a reason holds the refresh, so the form stays as it was rendered
    page.fill('input[aria-label="reason to resume"]', "INC-1 over")
    other = make_user("olga", "oncall")
    from runs.actions import resume_run

    resume_run(Run.objects.get(pk=active_run.pk), actor=other, reason="INC-1 over")
    pause_run(Run.objects.get(pk=active_run.pk), actor=other, reason="INC-2 primary CPU")

    page.click('[data-testid="resume"]')
    expect(page.locator(".messages")).to_contain_text("changed since the page was loaded")
    expect(page.locator(".messages")).to_contain_text("INC-2 primary CPU")
    expect(page.locator('[data-testid="run-state"]')).to_have_text(re.compile("paused", re.I))
    assert Run.objects.get(pk=active_run.pk).state == Run.State.PAUSED
    assert not OperatorAction.objects.filter(action="run.resume", actor="oscar").exists()


def test_the_run_page_shows_the_kill_switch_when_it_is_on(login, live_server, active_run, users):
    from runs.actions import set_kill_switch

    page = login("viewer")
    open_on_a_clock(page, f"{live_server.url}/runs/{active_run.pk}/")
    expect(page.locator('[data-testid="kill-switch-on"]')).to_have_count(0)

    set_kill_switch(True, actor=users["oncall"], reason="INC-52 primary at 95% CPU")
    # no reload: the refreshed part of the page brings the banner
    beats(page, 1)
    banner = page.locator('[data-testid="kill-switch-on"]')
    expect(banner).to_contain_text("INC-52 primary at 95% CPU")
    expect(banner).to_contain_text("oscar")


def test_an_unknown_slug_offers_the_closest_policy_and_a_404_has_a_way_back(
    login, live_server, active_run
):
    page = login("oncall")
    page.goto(f"{live_server.url}/?policy=evnts")
    expect(page.locator('[data-testid="closest"]')).to_contain_text("events")
    page.click('[data-testid="closest"] a >> text=events')
    expect(page.locator('[data-policy="events"]')).to_be_visible()

    response = page.goto(f"{live_server.url}/policies/no-such-policy/")
    assert response.status == 404
    expect(page.locator('[data-testid="error-404"]')).to_contain_text("no-such-policy")
    page.click('[data-testid="error-404"] a >> text=Overview')
    expect(page).to_have_url(f"{live_server.url}/")
    expect(page.locator('[data-policy="events"]')).to_be_visible()


# -- layout ---------------------------------------------------------------------


def assert_no_horizontal_overflow(page) -> None:
    """Nothing sticks out sideways: the document is no wider than the window."""
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.evaluate("window.innerWidth")
    assert width <= viewport, f"{page.url}: content {width}px wide in a {viewport}px window"


CLIPPED = """() => Array.from(document.querySelectorAll('.preview dl.facts dd')).filter(dd => {
    const card = dd.closest('.card').getBoundingClientRect();
    const box = dd.getBoundingClientRect();
    return box.right > card.right + 0.5 || dd.scrollWidth > dd.clientWidth + 1;
}).map(dd => dd.previousElementSibling.textContent)"""


def test_the_preview_summary_is_not_clipped(login, live_server, make_user):
    """What an approver checks (table, cutoff, sample keys) is inside its card, with a long
    table name, at both widths."""
    from tests.factories import approved_policy

    table = "rr_customer_interaction_events_archive_2019_q4"
    create_events(800, name=table)
    approved_policy(make_user, **events_spec(slug="archive", table=table))
    for width in (1024, 1400):
        page = login("compliance", width=width)
        for path in ("/policies/archive/v1/", "/policies/archive/v1/preview/"):
            page.goto(f"{live_server.url}{path}")
            expect(page.locator(".preview dl.facts").first).to_contain_text(table)
            assert page.evaluate(CLIPPED) == [], (path, width)
            assert_no_horizontal_overflow(page)
        shoot(page, f"preview-{width}")


def test_the_main_pages_fit_1024_and_1400_pixels(login, live_server, active_run, users):
    from runs.actions import resume_run

    pause_run(active_run, actor=users["oncall"], reason="INC-7 a long reason " + "x" * 120)
    resume_run(active_run, actor=users["oncall"], reason="INC-7 mitigated")
    for width in (1024, 1400):
        page = login("oncall", width=width)
        for name, path in (
            ("overview", "/"),
            ("run-page", f"/runs/{active_run.pk}/"),
            ("activity", "/runs/activity/"),
        ):
            page.goto(f"{live_server.url}{path}")
            assert_no_horizontal_overflow(page)
            shoot(page, f"{name}-{width}")
