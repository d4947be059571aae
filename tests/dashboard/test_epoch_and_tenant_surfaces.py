"""Every page, fragment, export, command and metric renders for a policy on an epoch timestamp
(bigint milliseconds, timestamp-ordered chunks on it) and for a tenant of two columns: no 500,
and where a surface shows a time it is a real date — never the raw number of milliseconds."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from retention import actions as retention_actions
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import Run
from tests.conftest import token_for_claim
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# a 13-digit number of milliseconds since the epoch in this decade: what no surface may show
RAW_MS = re.compile(r"(?<![\d.])1[78]\d{11}(?![\d])")


def _build(name: str, *, composite: bool) -> None:
    """``public.<name>``: 3,000 rows over 40 days before NOW, uuid-like random keys (so auto
    takes timestamp-ordered chunks), ``created_ms`` bigint milliseconds; tenant
    ``(entity_type, entity_id)`` or ``tenant_id``."""
    tenant = "entity_type text NOT NULL, entity_id bigint NOT NULL" if composite else (
        "tenant_id int NOT NULL"
    )  # fmt: skip
    values = (
        "(ARRAY['group','project','user'])[1 + g %% 3], 1 + g %% 7" if composite else "1 + g %% 5"
    )
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}")
        cur.execute(
            f"CREATE TABLE public.{name} (id uuid PRIMARY KEY, {tenant},"
            " created_ms bigint NOT NULL, status text)"
        )
        cur.execute(
            f"INSERT INTO public.{name} SELECT md5(g::text)::uuid, {values},"
            f" %s - (3000 - g)::bigint * 1152000, 'closed' FROM generate_series(1, 3000) AS g",
            [(NOW - EPOCH) // timedelta(milliseconds=1)],
        )
        cur.execute(f"CREATE INDEX ON public.{name} (created_ms, id)")
        cur.execute(f"ANALYZE public.{name}")


@pytest.fixture(params=["epoch", "composite"])
def surfaced(request, db, make_user, settings):
    """A policy (epoch ms; or epoch ms with a tenant of two columns), a hold, and a run with
    some chunks committed."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    composite = request.param == "composite"
    _build("rr_surface", composite=composite)
    fields = events_spec(
        slug="surface", table="rr_surface", timestamp="created_ms", timestamp_unit="ms",
        tenant=["entity_type", "entity_id"] if composite else "tenant_id", keep=[],
        chunking="timestamp",
    )  # fmt: skip
    policy = approved_policy(make_user, **fields)
    officer = make_user("hilda", "compliance")
    retention_actions.place_hold(
        actor=officer, reason="case 7", policy=policy,
        tenant=["project", "4"] if composite else "4",
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    run.refresh_from_db()
    return policy, run


def _cli(*args) -> str:
    token_for_claim(args)
    out = io.StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


RAW = {"key_lo", "key_hi", "hash", "prev_hash"}  # the record's exact, hashed values


def _manifest(client, run) -> dict:
    response = client.get(reverse("runs:manifest", args=[run.pk]))
    assert response.status_code == 200
    return json.loads(b"".join(response.streaming_content))


def _csv(client) -> str:
    response = client.get(reverse("runs:audit_export"))
    assert response.status_code == 200
    return b"".join(response.streaming_content).decode()


def _no_raw_times(text: str, where: str) -> None:
    found = RAW_MS.findall(text)
    assert not found, f"{where} shows raw epoch milliseconds {found[:3]}"


def test_every_surface_renders_and_shows_dates_for_an_epoch_policy(surfaced, client_for):
    policy, run = surfaced
    version = policy.approved_version
    client = client_for("auditor")
    pages = {
        "overview": reverse("home"),
        "policies": reverse("retention:policy_list"),
        "policy": reverse("retention:policy_detail", args=[policy.slug]),
        "version": reverse("retention:version_detail", args=[policy.slug, version.number]),
        "preview": reverse("retention:version_preview", args=[policy.slug, version.number]),
        "holds": reverse("retention:holds"),
        "runs": reverse("runs:list"),
        "run": reverse("runs:detail", args=[run.pk]),
        "audit": reverse("runs:audit"),
        "dead letters": reverse("runs:dead_letters"),
        "activity": reverse("runs:activity"),
    }
    for name, url in pages.items():
        reader = client_for("compliance") if name == "preview" else client  # compliance only
        for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
            response = reader.get(url, **headers)
            assert response.status_code == 200, (name, response.status_code)
            _no_raw_times(response.content.decode(), name)
    run_page = client.get(pages["run"]).content.decode()
    assert f"{run.cutoff:%Y-%m-%d}" in run_page
    # the chunks' bounds on the epoch column read as instants
    assert re.search(r"created_ms[^<]*\[\(?20\d\d-\d\d-\d\d", run_page), run_page

    # the evidence files keep each bound's exact value, as the record hashes it (key_lo,
    # key_hi), and say every time as a date
    manifest = _manifest(client, run)
    assert manifest["cutoff"] == run.cutoff.isoformat()
    done = [c for c in manifest["chunks"] if c["audit_seq"] is not None]
    assert done and all(re.match(r"\[\(20\d\d-", c["interval"]) for c in done), done[:2]
    _no_raw_times(json.dumps({k: v for k, v in manifest.items() if k != "chunks"}), "manifest")
    rows = list(csv.DictReader(io.StringIO(_csv(client))))
    assert rows and {r["cutoff"][:10] for r in rows} == {f"{run.cutoff:%Y-%m-%d}"}
    for row in rows:
        _no_raw_times(json.dumps({k: v for k, v in row.items() if k not in RAW}), "CSV")

    metrics = client_for("viewer").get(reverse("metrics"))
    assert metrics.status_code == 200
    assert "retention_backlog_overdue_seconds" in metrics.content.decode()

    status = _cli("status", run.run_key)
    _no_raw_times(status, "retention status")
    assert f"{run.cutoff:%Y-%m-%d}" in status
    json.loads(_cli("status", run.run_key, "--json"))
    preview_text = _cli("policy", "preview", policy.slug)
    _no_raw_times(preview_text, "retention policy preview")
    assert "oldest" not in preview_text or "20" in preview_text
    _cli("explain", policy.slug)
    _cli("check", run.run_key)
    _cli("hold", "list")


def test_a_drained_epoch_run_says_its_dates_in_status_and_manifest(surfaced, client_for):
    policy, run = surfaced
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    status = _cli("status", run.run_key)
    _no_raw_times(status, "retention status")
    manifest = _manifest(client_for("auditor"), run)
    assert manifest["run"]["state"] == "drained"
    _no_raw_times(json.dumps({k: v for k, v in manifest.items() if k != "chunks"}), "manifest")
