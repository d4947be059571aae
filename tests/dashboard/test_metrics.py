from __future__ import annotations

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from runs.models import Chunk
from runs.pages.metrics import reason_class

from .conftest import make_dead_letter
from .helpers import rows_deleted

pytestmark = pytest.mark.django_db


def scrape(client) -> dict:
    response = client.get(reverse("metrics"))
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_read_the_ledger(client_for, run, make_user):
    make_dead_letter(make_user, slug="gone")
    pending = run.chunks.filter(state="pending").count()

    m = scrape(client_for("viewer"))

    assert m[("retention_chunks", (("policy", "events"), ("state", "done")))] == 3
    assert m[("retention_chunks", (("policy", "events"), ("state", "pending")))] == pending
    assert m[("retention_rows_deleted_total", (("policy", "events"),))] == rows_deleted(run)
    assert m[("retention_dead_letters_open", (("policy", "gone"),))] == 1
    assert m[("retention_dead_letters_open", (("policy", "events"),))] == 0
    assert m[("retention_queue_age_seconds", (("policy", "events"),))] >= 0
    assert m[("retention_chunk_duration_seconds_count", (("policy", "events"),))] == 3
    assert (
        m[("retention_chunk_duration_seconds_bucket", (("le", "+Inf"), ("policy", "events")))] == 3
    )
    assert m[("retention_kill_switch_on", ())] == 0


def test_retries_and_throttles_are_counted(client_for, run):
    from django.utils import timezone

    first, second = run.chunks.filter(state="pending").order_by("id")[:2]
    Chunk.objects.filter(pk=first.pk).update(attempts=3)
    Chunk.objects.filter(pk=second.pk).update(
        throttle_reason="probe p95 41 ms > 25 ms",
        not_before=timezone.now() + timezone.timedelta(minutes=5),
    )

    m = scrape(client_for("viewer"))

    assert m[("retention_chunk_retries", (("policy", "events"),))] == 2
    assert m[("retention_throttled_chunks", (("policy", "events"), ("reason", "probe p95")))] == 1


def test_a_drained_run_sets_the_last_success_time(client_for, run):
    from runs.engine import worker

    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()

    m = scrape(client_for("viewer"))

    assert m[("retention_last_drained_run_timestamp_seconds", (("policy", "events"),))] == (
        pytest.approx(run.finished_at.timestamp())
    )


def test_throttle_reasons_lose_their_numbers():
    assert reason_class("probe p95 41 ms > 25 ms") == "probe p95"
    assert reason_class("replication lag 12.5 s > 10 s") == "replication lag"


def test_anonymous_scrapes_need_the_bearer_token(db):
    with override_settings(METRICS_TOKEN="s3cret-token"):
        assert Client().get(reverse("metrics")).status_code == 401
        wrong = Client().get(reverse("metrics"), HTTP_AUTHORIZATION="Bearer nope")
        assert wrong.status_code == 401
        ok = Client().get(reverse("metrics"), HTTP_AUTHORIZATION="Bearer s3cret-token")
        assert ok.status_code == 200
        assert b"retention_kill_switch_on" in ok.content


def test_no_token_configured_means_no_anonymous_scrape(db):
    with override_settings(METRICS_TOKEN=""):
        assert Client().get(reverse("metrics"), HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_a_signed_in_user_without_a_role_is_refused(make_user):
    client = Client()
    client.force_login(make_user("nobody"))
    assert client.get(reverse("metrics")).status_code == 403


def test_audit_totals_count_new_records_once_and_survive_a_rebuilt_trail(client_for, run):
    from django.core.cache import cache

    from runs.engine import worker
    from runs.pages.metrics import AUDIT_TOTALS_KEY

    client = client_for("viewer")
    first = scrape(client)[("retention_chunk_duration_seconds_count", (("policy", "events"),))]
    again = scrape(client)[("retention_chunk_duration_seconds_count", (("policy", "events"),))]
    assert first == again == 3

    assert worker.process_one(run).kind == worker.DONE
    m = scrape(client)
    assert m[("retention_chunk_duration_seconds_count", (("policy", "events"),))] == 4
    assert m[("retention_rows_deleted_total", (("policy", "events"),))] == rows_deleted(run)

    # A remembered position that no longer matches the trail is recomputed from the start.
    state = cache.get(AUDIT_TOTALS_KEY)
    cache.set(AUDIT_TOTALS_KEY, {**state, "hash": "not-this-trail"}, timeout=None)
    m = scrape(client)
    assert m[("retention_chunk_duration_seconds_count", (("policy", "events"),))] == 4
