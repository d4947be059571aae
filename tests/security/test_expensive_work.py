"""Expensive work is bounded: who may run a live preview and how often, the size of a
policy file however it arrives, the number of keep rules, the audit export's runtime."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.urls import reverse
from django.utils import timezone

from retention import actions
from retention import preview as preview_module
from retention.models import Policy, PolicyVersion
from retention.spec import MAX_KEEP_RULES, MAX_KEEP_VALUES, MAX_POLICY_BYTES, SpecError, load_toml
from tests.retention import conftest as retention_fixtures
from tests.retention.conftest import policy_toml, second_dsn

events_table = retention_fixtures.events_table  # the fixture, shared with tests/retention


@pytest.fixture
def version(events_table, make_user) -> PolicyVersion:
    alice = make_user("alice", "compliance")
    draft = actions.apply_spec(load_toml(policy_toml()), author=alice)
    return actions.submit_version(draft, actor=alice, reason="ready for review")


def live_url(version) -> str:
    return reverse("retention:version_preview", args=[version.policy.slug, version.number])


@pytest.mark.parametrize("role", ["viewer", "oncall", "auditor"])
def test_only_compliance_runs_a_live_preview(version, make_user, client, role):
    client.force_login(make_user(f"someone-{role}", role))
    assert client.get(live_url(version), HTTP_HX_REQUEST="true").status_code == 403
    page = client.get(reverse("retention:version_detail", args=["events", version.number]))
    assert live_url(version) not in page.content.decode()


def test_a_live_preview_is_computed_once_per_version_and_minute(
    version, make_user, client, monkeypatch
):
    client.force_login(make_user("bob", "compliance"))
    now = timezone.now().replace(second=5)
    monkeypatch.setattr(preview_module.timezone, "now", lambda: now)
    first = client.get(live_url(version), HTTP_HX_REQUEST="true").context["preview"]
    assert first["eligible"] > 0 and first["timeout_ms"] == preview_module.LIVE_PREVIEW_TIMEOUT_MS

    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.t_events WHERE occurred_at < now() - interval '40 days'")
    later_same_minute = now + timedelta(seconds=50)
    monkeypatch.setattr(preview_module.timezone, "now", lambda: later_same_minute)
    again = client.get(live_url(version), HTTP_HX_REQUEST="true").context["preview"]
    assert again == first  # served from the cache: no second full scan

    next_minute = now + timedelta(seconds=60)
    monkeypatch.setattr(preview_module.timezone, "now", lambda: next_minute)
    fresh = client.get(live_url(version), HTTP_HX_REQUEST="true").context["preview"]
    assert fresh["eligible"] < first["eligible"]


def test_a_pasted_policy_over_the_size_limit_is_refused_and_nothing_stored(
    events_table, make_user, client
):
    client.force_login(make_user("alice", "compliance"))
    text = policy_toml() + "\n# " + "x" * MAX_POLICY_BYTES + "\n"
    page = client.post(reverse("retention:version_create"), {"toml": text})
    assert page.status_code == 400
    assert f"more than {MAX_POLICY_BYTES}" in page.content.decode()
    assert not Policy.objects.exists()


def test_a_policy_file_over_the_size_limit_is_refused_on_the_command_line_too():
    with pytest.raises(SpecError, match=f"more than {MAX_POLICY_BYTES}"):
        load_toml(policy_toml() + "#" + "é" * (MAX_POLICY_BYTES // 2))


def test_keep_rules_and_their_value_lists_are_bounded():
    rule = '\n[[keep]]\ncolumn = "status"\nop = "="\nvalue = "legal"\n'
    load_toml(policy_toml() + rule * MAX_KEEP_RULES)
    with pytest.raises(SpecError, match=f"at most {MAX_KEEP_RULES} keep rules"):
        load_toml(policy_toml() + rule * (MAX_KEEP_RULES + 1))
    values = ", ".join(f'"s{i}"' for i in range(MAX_KEEP_VALUES + 1))
    listed = f'\n[[keep]]\ncolumn = "status"\nop = "in"\nvalues = [{values}]\n'
    with pytest.raises(SpecError, match=f"at most {MAX_KEEP_VALUES} values"):
        load_toml(policy_toml() + listed)


@pytest.mark.django_db(transaction=True)
def test_the_audit_export_stops_at_its_statement_timeout_and_says_the_file_is_incomplete(
    make_user, client, settings
):
    from runs.actions import trigger_run
    from runs.engine import planner, worker
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    create_events(600)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    assert worker.process_one(run).kind == worker.DONE
    client.force_login(make_user("audrey", "auditor"))
    settings.AUDIT_EXPORT_TIMEOUT_S = 1

    locked, release = threading.Event(), threading.Event()

    def hold_the_table():
        with psycopg.connect(second_dsn()) as conn:
            conn.execute("LOCK TABLE runs_auditrecord IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert locked.wait(30)
        response = client.get(reverse("runs:audit_export"))
        body = b"".join(response.streaming_content).decode()
    finally:
        release.set()
        holder.join(30)
    lines = body.strip().splitlines()
    assert len(lines) == 2  # the header, then the error instead of the rows
    assert lines[-1] == (
        "ERROR: export incomplete (statement timeout); narrow the filters and export again"
    )
    complete = b"".join(client.get(reverse("runs:audit_export")).streaming_content).decode()
    assert "ERROR" not in complete and len(complete.strip().splitlines()) == 2  # header + 1
