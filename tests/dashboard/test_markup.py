"""Markup that caches and assistive technology rely on: views serving both a page and an
HTMX fragment say ``Vary: HX-Request``; flash messages are a status region; badge colours
reach WCAG AA (4.5:1) for their 12 px text, computed from the stylesheet."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.urls import reverse

from .helpers import post

pytestmark = pytest.mark.django_db
CSS = Path(__file__).resolve().parents[2] / "static" / "css" / "app.css"


def test_every_page_and_fragment_view_varies_on_hx_request(client_for, run, users):
    client = client_for("compliance")
    version = run.policy_version
    urls = [
        reverse("home"),
        reverse("runs:detail", args=[run.pk]),
        reverse("retention:policy_list"),
        reverse("retention:version_preview", args=[run.policy.slug, version.number]),
    ]
    for url in urls:
        for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
            response = client.get(url, **headers)
            assert response.status_code == 200, (url, headers)
            vary = [v.strip().lower() for v in response.get("Vary", "").split(",")]
            assert "hx-request" in vary, (url, headers, response.get("Vary"))


def test_flash_messages_are_a_status_region(client_for, run):
    client = client_for("oncall")
    page = reverse("runs:detail", args=[run.pk])
    html = post(client, reverse("runs:pause", args=[run.pk]), {"reason": "INC-4"}, page=page)
    html = html.content.decode()
    # the region holds the list (a role on the <ul> itself would hide its items: axe listitem)
    assert re.search(r'<div role="status"><ul class="messages">', html)


def _luminance(hex_colour: str) -> float:
    h = hex_colour.lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    channels = [int(h[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def badge_colours() -> dict[str, tuple[str, str]]:
    css = CSS.read_text()
    variables = dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{3,6})", css))

    def resolve(value: str) -> str:
        value = value.strip()
        return variables.get(value[6:-1], value) if value.startswith("var(") else value

    out = {}
    for selectors, body in re.findall(r"([^{}]*\.badge[^{}]*)\{([^}]*)\}", css):
        bg = re.search(r"background:\s*([^;]+);", body)
        fg = re.search(r"(?<![-\w])color:\s*([^;]+);", body)
        if not (bg and fg):
            continue
        for selector in selectors.split(","):
            out[selector.strip()] = (resolve(fg.group(1)), resolve(bg.group(1)))
    return out


def test_contrast_helper_matches_known_ratios():
    assert round(contrast("#000000", "#ffffff"), 1) == 21.0
    assert round(contrast("#777777", "#ffffff"), 2) == 4.48


def test_every_badge_reaches_4_5_to_1():
    colours = badge_colours()
    for name in (".badge.paused", ".badge.waiting", ".badge.throttled", ".badge.draft",
                 ".badge.ok", ".badge.drained", ".badge.active", ".badge.dead"):  # fmt: skip
        assert name in colours, name
    low = {
        name: round(contrast(fg, bg), 2)
        for name, (fg, bg) in colours.items()
        if contrast(fg, bg) < 4.5
    }
    assert low == {}


class _Controls(HTMLParser):
    """Form controls without an accessible name, and progress bars without ARIA."""

    def __init__(self):
        super().__init__()
        self.in_label = 0
        self.unlabelled: list[str] = []
        self.bare_progress: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "label":
            self.in_label += 1
        elif tag in ("input", "select", "textarea"):
            if a.get("type") in ("hidden", "submit", "button"):
                return
            if not (self.in_label or a.get("aria-label") or a.get("aria-labelledby")):
                self.unlabelled.append(f"<{tag} name={a.get('name')}>")
        if "progress" in (a.get("class") or "").split() and tag != "progress":
            if not (a.get("role") == "progressbar" and "aria-valuenow" in a):
                self.bare_progress.append(f"<{tag} class={a.get('class')}>")

    def handle_endtag(self, tag):
        if tag == "label":
            self.in_label -= 1


def test_inputs_are_labelled_and_progress_bars_speak(client_for, run, make_user):
    from retention.actions import place_hold, request_hold_release

    hilda = make_user("hilda", "compliance")
    hold = place_hold(policy=run.policy, actor=hilda, reason="litigation")
    client = client_for("compliance")
    oncall = client_for("oncall")
    unrequested = client.get(reverse("retention:hold_release_request", args=[hold.pk]))
    request_hold_release(hold, actor=hilda, reason="settled")
    pages = {
        "holds": client.get(reverse("retention:holds")),
        "hold": client.get(reverse("retention:hold_detail", args=[hold.pk])),
        "release confirmation": unrequested,
        "approval confirmation": client.get(
            reverse("retention:hold_release_approve", args=[hold.pk])
        ),
        "policy": client.get(reverse("retention:policy_detail", args=[run.policy.slug])),
        "run": oncall.get(reverse("runs:detail", args=[run.pk])),
        "overview": oncall.get(reverse("home")),
    }
    for name, response in pages.items():
        parser = _Controls()
        parser.feed(response.content.decode())
        assert parser.unlabelled == [], name
        assert parser.bare_progress == [], name
