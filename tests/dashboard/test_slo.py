"""The backlog SLO of a policy ([slo] max_backlog_age) on the overview and in /metrics, and
every metric the shipped alert rules read is exported."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from retention.spec import SpecError, load_toml
from runs.actions import trigger_run
from runs.engine import planner
from tests.factories import approved_policy, backdate_approval, events_spec
from tests.retention.conftest import policy_toml
from tests.runs.conftest import NOW, ROOT, create_events

from .test_metrics import scrape

pytestmark = pytest.mark.django_db


def test_the_slo_table_is_parsed_normalised_and_round_trips():
    spec = load_toml(policy_toml(tables='[slo]\nmax_backlog_age = "2   days"\n'))
    assert spec.max_backlog_age == "2 days" and spec.max_backlog_age_s == 2 * 86400
    assert load_toml(spec.to_toml()) == spec
    assert "max_backlog_age" not in load_toml(policy_toml()).to_json()  # old hashes unchanged
    with pytest.raises(SpecError, match="slo.max_backlog_age"):
        load_toml(policy_toml(tables='[slo]\nmax_backlog_age = "soon"\n'))
    with pytest.raises(SpecError, match="unknown key"):
        load_toml(policy_toml(tables='[slo]\nmax_age = "2 days"\n'))


@pytest.fixture
def slo_policy(make_user):
    create_events(3000)  # rows up to 40 days before NOW: far past a 20-day retention
    return approved_policy(make_user, **events_spec(slo={"max_backlog_age": "2 days"}))


def test_the_overview_shows_the_slo_and_that_it_is_breached(client_for, slo_policy):
    page = client_for("viewer").get("/", secure=True).content.decode()
    cell = re.search(r'data-testid="backlog-slo">(.*?)</dd>', page, re.S).group(1)
    assert "breached" in cell and "of at most 2 days" in cell


def test_metrics_export_the_slo_and_the_overdue_backlog(client_for, slo_policy, make_user):
    create_events(600, name="rr_plain")
    approved_policy(make_user, **events_spec(slug="plain", table="rr_plain"))
    m = scrape(client_for("viewer"))
    assert m[("retention_backlog_slo_seconds", (("policy", "events"),))] == 2 * 86400
    assert m[("retention_backlog_overdue_seconds", (("policy", "events"),))] > 2 * 86400
    assert ("retention_backlog_slo_seconds", (("policy", "plain"),)) not in m
    assert ("retention_backlog_overdue_seconds", (("policy", "plain"),)) in m


def test_every_metric_the_alert_rules_read_is_exported(client_for, slo_policy):
    backdate_approval(slo_policy, timezone.now() - timedelta(days=3))
    run, _ = trigger_run(slo_policy, tick=NOW)
    planner.plan(run)  # pending chunks: a queue age
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    used = set(re.findall(r"\b(retention_[a-z_]+)\b", rules))
    assert len(used) >= 9, used
    exported = {name for name, _labels in scrape(client_for("viewer"))}
    assert used <= exported, used - exported
