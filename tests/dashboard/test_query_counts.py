"""The run page, its fragment and the overview read with a fixed number of queries: more
chunks, more runs, more audit rows and more operator actions add none (behaviour, not
timing; the latency figures live in bench/dashboard.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runs.actions import pause_run, resume_run, trigger_run
from runs.engine import planner, worker
from tests.runs.conftest import NOW

# not about the guard: its chunks commit whatever a busy machine does to the guard's probe
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_guard")]


def queries(client, url: str, run, **headers) -> int:
    """Queries of a page read after one more chunk of ``run`` committed: the read that sums the
    audit records new since the last one and remembers the sums (runs.progress.audit_tallies),
    as every read of a draining run does."""
    client.get(url, **headers)  # warm: sessions, caches
    assert worker.process_one(run).kind == worker.DONE
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url, **headers).status_code == 200
    return len(captured)


def later_run(run, years: int):
    """A later run of the same policy (waiting behind ``run``), planned."""
    later, _ = trigger_run(run.policy, tick=NOW.replace(year=NOW.year + years))
    planner.plan(later)
    return later


def grow(run, users) -> None:
    """More committed chunks, one more run of the policy and more operator actions."""
    done = sum(worker.process_one(run).kind == worker.DONE for _ in range(4))
    assert done >= 2
    for i in range(5):
        pause_run(run, actor=users["oncall"], reason=f"INC-{i}")
        resume_run(run, actor=users["oncall"], reason=f"INC-{i} over")
    later_run(run, 2)


@pytest.mark.parametrize("fragment", [False, True])
def test_the_run_page_query_count_does_not_grow_with_chunks_runs_or_actions(
    client_for, run, users, fragment, django_assert_max_num_queries
):
    client = client_for("oncall")
    url = reverse("runs:detail", args=[run.pk])
    headers = {"HTTP_HX_REQUEST": "true"} if fragment else {}
    later_run(run, 1)  # the policy's latest run is not the one shown: its progress is read too
    before = queries(client, url, run, **headers)
    audit_before = run.audit_records.count()

    grow(run, users)

    assert run.audit_records.count() > audit_before
    with django_assert_max_num_queries(before):
        assert client.get(url, **headers).status_code == 200


def test_the_overview_query_count_does_not_grow_with_runs(
    client_for, run, users, django_assert_max_num_queries
):
    client = client_for("oncall")
    later_run(run, 1)
    before = queries(client, reverse("home"), run)

    grow(run, users)

    with django_assert_max_num_queries(before):
        assert client.get(reverse("home")).status_code == 200


def test_the_runs_list_shows_rows_deleted_per_run_with_a_fixed_number_of_queries(
    client_for, run, users, django_assert_max_num_queries
):
    from django.utils import timezone

    from runs.progress import progress_for

    client = client_for("viewer")
    url = reverse("runs:list")
    before = queries(client, url, run)

    grow(run, users)  # more chunks committed, one more run, more actions
    later_run(run, 3)

    with django_assert_max_num_queries(before):
        html = client.get(url).content.decode()
    truth = progress_for([run.pk], now=timezone.now())[run.pk]
    assert truth.rows_deleted > 0
    row = html.split(f">{run.run_key}</a>")[1].split("</tr>")[0]
    assert f'<td class="num" data-testid="rows-deleted">{truth.rows_deleted:,}</td>' in row
    assert "<th>Rows deleted</th>" in html


def more_policies(make_user, n: int) -> None:
    """``n`` more approved policies, each on its own table, none with a run."""
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import create_events

    for i in range(n):
        create_events(300, name=f"rr_more{i}")
        approved_policy(make_user, **events_spec(slug=f"more{i}", table=f"rr_more{i}"))


@pytest.mark.parametrize("url", ["home", "metrics"])
def test_the_overview_and_metrics_read_every_policy_with_a_fixed_number_of_queries(
    client_for, run, make_user, url, django_assert_max_num_queries
):
    """What each policy's card and series need (its runs, approved version, guard state,
    armed tick, cached drain-window measurement) is read once for all policies: three more
    policies add no query once their drain windows are measured (the warm-up request)."""
    client = client_for("oncall")
    before = queries(client, reverse(url), run)
    more_policies(make_user, 3)
    client.get(reverse(url))  # measures the new policies' drain windows (cached 15 s)
    with django_assert_max_num_queries(before):
        response = client.get(reverse(url))
    assert response.status_code == 200
    body = response.content.decode()
    assert all(f"more{i}" in body for i in range(3))
