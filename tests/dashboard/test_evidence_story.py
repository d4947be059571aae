"""Evidence that tells the whole story: the manifest lists the run's dead letters and who
replayed or discarded them; the manifest and the CSV name the version as it was approved,
with its approval's reason and time; the run page gives its verification in words."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime

import pytest
from django.urls import reverse

from retention.models import Policy
from runs.actions import replay_dead_letter
from runs.engine import worker

from .conftest import make_dead_letter

pytestmark = pytest.mark.django_db(transaction=True)


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_the_manifest_lists_dead_letters_and_who_replayed_them(client_for, make_user, users):
    letter = make_dead_letter(make_user, slug="gone", rows=300)
    replay_dead_letter(letter, actor=users["oncall"], reason="INC-5 table restored")
    Policy.objects.filter(pk=letter.run.policy_id).update(name="Renamed since")
    manifest = json.loads(
        _body(client_for("auditor").get(reverse("runs:manifest", args=[letter.run_id])))
    )
    (entry,) = manifest["dead_letters"]
    assert entry["id"] == letter.pk and entry["sqlstate"] == "42P01"
    assert (entry["resolution"], entry["resolved_by"], entry["reason"]) == (
        "replayed", "oscar", "INC-5 table restored",
    )  # fmt: skip
    assert manifest["policy"]["name"] == "Gone older than 20 days"
    assert manifest["policy"]["name_today"] == "Renamed since"


def test_the_csv_names_the_version_and_its_approval(client_for, run):
    version = run.policy_version
    response = client_for("auditor").get(reverse("runs:audit_export") + f"?run={run.pk}")
    rows = list(csv.DictReader(io.StringIO(_body(response).decode())))
    assert rows
    for row in rows:
        assert row["version_name"] == version.spec["name"]
        assert row["approval_reason"] == version.decision_reason
        # the record's own text (PostgreSQL drops a fraction's trailing zeros): the same instant
        assert datetime.fromisoformat(row["approved_at"]) == version.decided_at


def test_the_run_page_gives_its_verification_in_words(client_for, run, no_guard):
    worker.drain(run.pk, until_idle=True, budget_s=60)
    run.refresh_from_db()
    assert run.verification
    html = client_for("viewer").get(reverse("runs:detail", args=[run.pk])).content.decode()
    section = html.split('data-testid="verification"', 1)[1].split("</section>", 1)[0]
    assert "Verified: no eligible row left" in section
    assert "{" not in section and "}" not in section
