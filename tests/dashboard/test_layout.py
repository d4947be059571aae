"""What the pages print: verification as a readable list, tenants in natural order, every
timestamp with its zone, counts with thousands separators, human state names, the rows/s
chart with its axis and pace line, and old runs named by the version they ran. Each page is
rendered with the test client and parsed."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse

from core.formatting import STATE_LABELS, natural_key, number, when
from retention import actions as retention_actions
from retention.models import PolicyVersion
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Chunk, DeadLetter, Run
from tests.factories import approved_policy, events_spec, release_hold
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db


class Text(HTMLParser):
    """The page's text, element by element: ``(tag, attrs, text)`` for every text node, with
    the innermost open tag; ``<script>``, ``<style>``, ``<pre>`` and ``<textarea>`` skipped."""

    SKIP = {"script", "style", "pre", "textarea"}
    VOID = {"br", "input", "img", "meta", "link", "hr", "line", "rect", "path", "circle"}

    def __init__(self, html: str):
        super().__init__()
        self.stack: list[tuple[str, dict]] = []
        self.nodes: list[tuple[str, dict, str, list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if not data.strip() or any(t in self.SKIP for t, _ in self.stack):
            return
        tag, attrs = self.stack[-1] if self.stack else ("", {})
        classes = [c for _, a in self.stack for c in (a.get("class") or "").split()]
        self.nodes.append((tag, attrs, data.strip(), classes))

    def text(self) -> str:
        return "\n".join(n[2] for n in self.nodes)


def page(client, url: str) -> Text:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return Text(response.content.decode())


@pytest.fixture
def tenant_run(db, make_user) -> Run:
    """A run over twelve tenants (1 … 12), planned, two chunks committed."""
    create_events(4000, tenants=12)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(2):
        assert worker.process_one(run).kind == worker.DONE
    run.refresh_from_db()
    return run


# -- verification -------------------------------------------------------------


def test_verification_is_a_readable_list_not_a_dict(client_for, run):
    Run.objects.filter(pk=run.pk).update(
        verification={
            "remaining": 0,
            "deferred_by_holds": 1234,
            "holds": [5, 6],
            "discarded": [
                {"chunk": 7, "tenant": "3", "key_from": 1, "key_to": 400, "rows": 12,
                 "by": "oscar", "why": "INC-7 corrupt rows"}
            ],
            "not_eligible_null": 5,
            "limit": 100000,
            "checked_at": "2026-12-01T10:00:00+00:00",
            "pass": 1,
        }
    )  # fmt: skip
    response = client_for("viewer").get(reverse("runs:detail", args=[run.pk]))
    html = response.content.decode()

    assert "{&#x27;" not in html and "{'" not in html
    section = html.split('data-testid="verification"', 1)[1].split("</section>", 1)[0]
    text = Text(section).text()
    assert "Eligible rows left" in text and "Deferred by legal holds" in text
    assert "1,234" in text
    assert "Legal holds in force" in text and "#5, #6" in text
    assert "2026-12-01 10:00:00 UTC" in text
    assert "INC-7 corrupt rows" in text and "oscar" in text


# -- tenants ------------------------------------------------------------------


def test_per_tenant_rows_sort_in_natural_order(client_for, tenant_run):
    html = client_for("viewer").get(reverse("runs:detail", args=[tenant_run.pk])).content.decode()
    order = re.findall(r'<tr data-tenant="([^"]*)"', html)

    assert len(order) == 12
    assert order == [str(n) for n in range(1, 13)], order


def test_the_natural_key_orders_numbers_as_numbers_and_keeps_ties_stable():
    tenants = ["10", "2", "t10", "t2", "1", "", "b", "a"]
    assert sorted(tenants, key=natural_key) == ["", "1", "2", "10", "a", "b", "t2", "t10"]
    assert sorted(["02", "2"], key=natural_key) == ["02", "2"]  # equal keys keep their order


# -- timestamps ---------------------------------------------------------------

STAMP = re.compile(r"(?<![/\w])\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:\.\d+)?(?![\d:.])")
# a zone abbreviation, an offset, or an IANA name in parentheses: "(Europe/Berlin)"
ZONE = re.compile(r"\s*(UTC|[A-Z]{2,5}\b|[+-]\d\d:?\d\d|\([A-Z][A-Za-z_]+(/[A-Za-z_+-]+)*\))")


def _unzoned(text: str) -> list[str]:
    return [
        text[m.start() : m.end() + 12]
        for m in STAMP.finditer(text)
        if not ZONE.match(text, m.end())
    ]


def test_every_timestamp_on_the_pages_names_its_zone(client_for, run, users, make_user):
    compliance = users["compliance"]
    retention_actions.place_hold(
        actor=compliance, reason="litigation L-1", policy=run.policy, tenant="3"
    )
    release_hold(
        retention_actions.place_hold(actor=compliance, reason="L-2", policy=run.policy),
        requester=compliance,
        approver=make_user("cora", "compliance"),
        reason="settled",
    )
    v = run.policy_version
    client = client_for("compliance")
    urls = [
        reverse("home"),
        reverse("runs:list"),
        reverse("runs:detail", args=[run.pk]),
        reverse("runs:activity"),
        reverse("runs:audit") + f"?run={run.pk}",
        reverse("retention:policy_list"),
        reverse("retention:policy_detail", args=[run.policy.slug]),
        reverse("retention:version_detail", args=[run.policy.slug, v.number]),
        reverse("retention:holds"),
    ]
    for url in urls:
        text = page(client, url).text()
        assert not _unzoned(text), (url, _unzoned(text))


def test_the_when_filter_names_the_zone():
    assert when(NOW) == NOW.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    assert when("2026-12-01T10:00:00+00:00", "minutes") == "2026-12-01 10:00 UTC"
    assert when(None) == "—"


# -- numbers ------------------------------------------------------------------

BARE = re.compile(r"(?<![\d,.#:/-])\d{4,}(?![\d,.:-])")


def test_counts_carry_thousands_separators(client_for, tenant_run, users):
    client = client_for("compliance")
    v = tenant_run.policy_version
    for url in (
        reverse("home"),
        reverse("runs:detail", args=[tenant_run.pk]),
        reverse("retention:version_detail", args=[tenant_run.policy.slug, v.number]),
    ):
        parsed = page(client, url)
        numeric = [
            text
            for tag, attrs, text, classes in parsed.nodes
            if "num" in classes
            or attrs.get("data-testid") in {"rows-deleted", "rows-expected", "progress"}
            or "data-eligible" in attrs
            or tag == "strong"
        ]
        bare = [t for t in numeric if BARE.search(t)]
        assert not bare, (url, bare)


def test_the_number_filter():
    assert number(499970) == "499,970"
    assert number("325867") == "325,867"
    assert number(12.0) == "12"
    assert number(1234.56) == "1,234.6"
    assert number(None) == "—"
    assert number("n/a") == "n/a"


# -- state names --------------------------------------------------------------


def test_every_stored_state_has_a_human_label():
    for choices in (Run.State, Chunk.State, PolicyVersion.State, DeadLetter.Resolution):
        for value, label in choices.choices:
            assert value in STATE_LABELS, value
            if label.lower() != value.replace("_", " "):  # a model's own label is the label
                assert STATE_LABELS[value] == label, (value, label)


def test_badges_show_human_labels_not_stored_names(client_for, run, users):
    Run.objects.filter(pk=run.pk).update(state=Run.State.CONFIRM, state_reason="blast radius")
    submitted = retention_actions.submit_version(
        retention_actions.apply_spec(
            PolicySpec.parse(events_spec(retention="30 days")), author=users["compliance"]
        ),
        actor=users["compliance"],
        reason="shorter",
    )
    raw = {k for k, v in STATE_LABELS.items() if k != v}
    client = client_for("oncall")
    for url in (
        reverse("home"),
        reverse("runs:list"),
        reverse("runs:detail", args=[run.pk]),
        reverse("retention:policy_list"),
        reverse("retention:policy_detail", args=[run.policy.slug]),
        reverse("retention:version_detail", args=[run.policy.slug, submitted.number]),
    ):
        badges = [t for _, _, t, classes in page(client, url).nodes if "badge" in classes]
        assert badges, url
        assert not [b for b in badges if b in raw], (url, badges)
    html = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert "held for confirmation" in html


# -- chart --------------------------------------------------------------------


def test_the_rate_chart_has_a_y_axis_and_the_pace_line(client_for, make_user):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec(pace_rows_per_s=50_000))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    chart = html.split('data-testid="rate-chart"', 1)[1].split("</svg>", 1)[0]

    ticks = re.findall(r'<text[^>]*class="axis y-tick"[^>]*>([^<]+)</text>', chart)
    assert len(ticks) >= 3 and ticks[0].strip() == "0", ticks
    assert 'data-testid="pace-line"' in chart
    assert "pace 50,000 rows/s" in chart
    assert "rows/s" in chart  # the axis names its unit


def test_a_peak_over_the_pace_is_explained(client_for, make_user):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec(pace_rows_per_s=10))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(2):
        assert worker.process_one(run).kind == worker.DONE
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()

    assert 'data-testid="over-pace"' in html
    assert "on average over each chunk and its wait" in html


# -- old runs -----------------------------------------------------------------


def test_an_old_run_is_labelled_by_the_version_it_ran(client_for, run, users, make_user):
    old_name = run.policy_version.spec["name"]
    renamed = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(name="Events kept 30 days", retention="30 days")),
        author=users["compliance"],
    )
    renamed = retention_actions.submit_version(renamed, actor=users["compliance"], reason="r")
    retention_actions.approve_version(renamed, actor=make_user("cora", "compliance"), reason="ok")
    run.policy.refresh_from_db()
    assert run.policy.name == "Events kept 30 days"
    client = client_for("viewer")

    html = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    head = html.split('<div class="page-head">', 1)[1].split("</div>", 1)[0]
    assert old_name in head and f"v{run.policy_version.number}" in head
    assert "Events kept 30 days" not in head
    listing = client.get(reverse("runs:list")).content.decode()
    row = listing.split(f'href="{reverse("runs:detail", args=[run.pk])}"', 1)[1].split("</tr>")[0]
    assert old_name in row and "Events kept 30 days" not in row
