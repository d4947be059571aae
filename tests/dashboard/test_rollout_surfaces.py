"""Count and slice runs on every surface: the run page says the stage and the bound, a count
run's counts; the CSV and the manifest carry them; the approval card shows the step and what
the last count run found; the policy page shows the rollout history; the drain window judges
a count-only policy from two count runs."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.urls import reverse

from retention import actions as retention_actions
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.counts import count_totals
from runs.engine import worker
from runs.forecast import drain_window
from runs.models import AuditRecord, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db


def _drained(run: Run) -> Run:
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    return run


@pytest.fixture
def count_run(db, make_user) -> Run:
    create_events(1500)
    policy = approved_policy(make_user, **events_spec(rollout="count"))
    return _drained(trigger_run(policy, tick=NOW)[0])


@pytest.fixture
def slice_run(db, make_user) -> Run:
    create_events(1500)
    policy = approved_policy(make_user, **events_spec(rollout="slice", slice="10 days"))
    return _drained(trigger_run(policy, tick=NOW)[0])


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_the_run_page_of_a_count_run_shows_its_counts(client_for, count_run):
    assert count_run.state == Run.State.COUNTED
    totals = count_totals(count_run)
    html = client_for("viewer").get(reverse("runs:detail", args=[count_run.pk])).content.decode()

    assert 'data-testid="run-rollout"' in html and ">count</span>" in html
    assert 'data-testid="run-state">Counted<' in html
    counted = html.split('data-testid="counted-card"', 1)[1].split("</section>")[0]
    assert f"<strong>{totals['rows']:,}</strong> rows a full run of this cutoff would delete" in (
        counted
    )
    assert f"{totals['kept']:,} kept by keep rules" in counted
    biggest = max(totals["tenants"].items(), key=lambda kv: kv[1])
    assert f'<code>{biggest[0]}</code></td><td class="num">{biggest[1]:,}' in counted
    for month in totals["ages"]:
        assert f"<td>{month}</td>" in counted


def test_the_run_page_of_a_slice_run_says_its_bound(client_for, slice_run):
    html = client_for("viewer").get(reverse("runs:detail", args=[slice_run.pk])).content.decode()

    bound = slice_run.slice_bound.strftime("%Y-%m-%d %H:%M:%S")
    assert 'data-testid="slice-bound"' in html
    assert bound in html.split('data-testid="slice-bound"', 1)[1].split("</dd>")[0]
    assert "cutoff − 10 days" in html
    assert 'data-testid="counted-card"' not in html


def test_the_csv_and_the_manifest_carry_the_stage_and_a_count_runs_counts(client_for, count_run):
    totals = count_totals(count_run)
    client = client_for("auditor")
    rows = list(
        csv.DictReader(
            io.StringIO(
                _body(client.get(reverse("runs:audit_export") + f"?run={count_run.pk}")).decode()
            )
        )
    )
    assert rows and {r["outcome"] for r in rows} == {"counted"}
    assert {r["rollout"] for r in rows} == {"count"}
    assert sum(int(r["rows_counted"]) for r in rows) == totals["rows"]
    assert {r["rows_deleted"] for r in rows} == {"0"}
    assert all(r["chain_seq"] == "" for r in rows)  # no audit record: nothing deleted

    manifest = json.loads(_body(client.get(reverse("runs:manifest", args=[count_run.pk]))))
    assert manifest["run"]["rollout"] == "count" and manifest["run"]["state"] == "counted"
    assert manifest["totals"]["rows_counted"] == totals["rows"]
    assert manifest["totals"]["rows_deleted"] == 0
    assert manifest["totals"]["rows_counted_by_tenant"] == totals["tenants"]
    done = [c for c in manifest["chunks"] if c["state"] == "done"]
    assert done and {c["outcome"] for c in done} == {"counted"}
    assert sum(c["counts"]["rows"] for c in done) == totals["rows"]


def test_the_csv_and_the_manifest_of_a_slice_run_name_its_bound(client_for, slice_run):
    client = client_for("auditor")
    rows = list(
        csv.DictReader(
            io.StringIO(
                _body(client.get(reverse("runs:audit_export") + f"?run={slice_run.pk}")).decode()
            )
        )
    )
    assert rows and {r["rollout"] for r in rows} == {"slice"}
    assert {r["cutoff"] for r in rows} == {slice_run.slice_bound.isoformat()}
    assert sum(int(r["rows_deleted"]) for r in rows) == sum(
        AuditRecord.objects.filter(run=slice_run).values_list("rows_deleted", flat=True)
    )
    manifest = json.loads(_body(client.get(reverse("runs:manifest", args=[slice_run.pk]))))
    assert manifest["run"]["rollout"] == "slice"
    assert manifest["run"]["slice_bound"] == slice_run.slice_bound.isoformat()
    assert "rows_counted" not in manifest["totals"]


def test_the_approval_card_shows_the_step_and_the_last_count(
    client_for, count_run, users, make_user
):
    carla = users["compliance"]
    draft = retention_actions.apply_spec(
        PolicySpec.parse(events_spec(rollout="slice", slice="10 days")), author=carla
    )
    version = retention_actions.submit_version(draft, actor=carla, reason="slice next")
    client = client_for("compliance")
    client.force_login(make_user("cora", "compliance"))
    html = client.get(reverse("retention:approvals")).content.decode()

    card = html.split(f'data-approval="events-v{version.number}"', 1)[1].split("</section>")[0]
    step = card.split('data-testid="rollout-step"', 1)[1].split("</dd>")[0]
    assert ">count</span> → <span" in step and ">slice</span>" in step
    assert "<code>10 days</code>" in step
    last = card.split('data-testid="last-count"', 1)[1].split("</dd>")[0]
    assert count_run.run_key in last
    assert f'data-count="counted">{count_totals(count_run)["rows"]:,}<' in last


def test_the_policy_page_shows_the_rollout_history(client_for, count_run, make_user):
    policy = count_run.policy
    approved_policy(make_user, **events_spec(rollout="slice", slice="10 days"))
    slice_run = _drained(trigger_run(policy, tick=NOW + timedelta(days=1))[0])
    html = (
        client_for("viewer")
        .get(reverse("retention:policy_detail", args=[policy.slug]))
        .content.decode()
    )

    history = html.split('data-testid="rollout-history"', 1)[1].split("</table>")[0]
    v1 = history.split('data-rollout-version="1"', 1)[1].split("</tr>")[0]
    v2 = history.split('data-rollout-version="2"', 1)[1].split("</tr>")[0]
    assert ">count</span>" in v1 and count_run.run_key in v1
    assert f"{count_totals(count_run)['rows']:,} counted" in v1
    assert ">slice</span>" in v2 and "<code>10 days</code>" in v2 and slice_run.run_key in v2
    deleted = sum(AuditRecord.objects.filter(run=slice_run).values_list("rows_deleted", flat=True))
    assert f"{deleted:,} deleted before" in v2
    assert 'data-testid="rollout-last-count"' in html


def test_the_drain_window_of_a_count_only_policy_is_judged_from_two_count_runs(
    count_run, make_user
):
    policy = count_run.policy
    first = drain_window(policy, fresh=True)
    assert first["backlog_rows"] == count_totals(count_run)["rows"]
    assert "a second count run shows the inflow" in first["explanation"]
    second = _drained(trigger_run(policy, tick=NOW + timedelta(days=1))[0])
    window = drain_window(policy, fresh=True)
    grown = count_totals(second)["rows"] - count_totals(count_run)["rows"]
    assert window["inflow_per_day"] == grown > 0
    assert window["verdict"] in ("converges", "at risk")
    assert "count runs (nothing deleted)" in window["explanation"]


def test_the_form_editor_promotes_a_stage_as_a_new_version(client_for, count_run):
    from .helpers import post

    client = client_for("compliance")
    page = "/policies/events/"
    html = client.get(page).content.decode()
    assert '<option value="count" selected>' in html and 'name="slice" value=""' in html
    form = {
        "editor": "form", "slug": "events", "base": "1", "name": "Events older than 20 days",
        "retention": "20 days", "schedule": "0 3 * * *", "chunk_size": "200",
        "rollout": "slice", "slice": "",
        "keep-0-column": "status", "keep-0-op": "=", "keep-0-value": '"disputed"',
    }  # fmt: skip
    refused = post(client, reverse("retention:version_create"), form, page=page)
    assert refused.status_code == 400
    assert refused.context["form"]["error_field"] == "rollout"
    assert "needs slice" in refused.context["form"]["error"]

    post(client, reverse("retention:version_create"), {**form, "slice": "10 days"}, page=page)
    draft = count_run.policy.versions.get(number=2)
    assert (draft.parsed.rollout, draft.parsed.slice) == ("slice", "10 days")
    assert draft.state != "approved"  # a second person approves it


def test_the_run_list_and_the_overview_mark_count_and_slice_runs(client_for, count_run):
    client = client_for("viewer")
    runs = client.get(reverse("runs:list")).content.decode()
    row = runs.split(count_run.run_key, 1)[1].split("</tr>", 1)[0]
    assert 'data-testid="run-rollout">count<' in row
    overview = client.get(reverse("home")).content.decode()
    card = overview.split(f'data-policy="{count_run.policy.slug}"', 1)[1].split("</section>")[0]
    assert 'data-testid="run-rollout">count<' in card
    assert "a count run: nothing deleted" in card
    assert 'aria-valuenow="100"' in card  # counted whole
