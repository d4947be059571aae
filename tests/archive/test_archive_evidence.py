"""Evidence of an archiving run: status, run page, CSV, manifest; ``audit verify --archives``."""

from __future__ import annotations

import csv
import io
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.actions import trigger_run
from runs.engine import worker
from runs.models import AuditRecord, Run
from runs.status import run_status
from tests.runs.conftest import NOW


@pytest.fixture
def drained(typed_policy, no_guard):
    run, _ = trigger_run(typed_policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def _objects(run):
    return [o for r in AuditRecord.objects.filter(run=run) for o in r.archive["objects"]]


def verify(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("retention", "audit", "verify", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue(), err.getvalue() + str(exc)
    return out.getvalue(), err.getvalue()


def test_status_page_csv_and_manifest_list_every_object_with_its_digest(
    drained, archive_dir, client, make_user
):
    objects = _objects(drained)
    deleted = sum(r.rows_deleted for r in AuditRecord.objects.filter(run=drained))
    assert len(objects) >= 3 and deleted > 100
    files = sorted(archive_dir.rglob("*.parquet"))
    assert len(files) == len(objects)

    out = StringIO()
    call_command("retention", "status", drained.run_key, "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["archived_rows"] == deleted == status["rows_deleted"]
    assert run_status(drained)["archived_rows"] == deleted

    client.force_login(make_user("audrey", "auditor"))
    page = client.get(f"/runs/{drained.pk}/").content.decode()
    assert f"{deleted:,} rows archived" in page
    for o in objects:
        assert o["name"] in page and o["sha256"] in page

    body = b"".join(client.get(f"/runs/audit/export.csv?run={drained.pk}").streaming_content)
    lines = list(csv.DictReader(io.StringIO(body.decode())))
    by_name = {line["archive_objects"]: line for line in lines}
    for o in objects:
        assert by_name[o["name"]]["archive_sha256"] == o["sha256"]
        assert int(by_name[o["name"]]["archive_rows"]) == o["rows"]

    manifest = json.loads(
        b"".join(client.get(f"/runs/{drained.pk}/manifest.json").streaming_content)
    )
    assert manifest["totals"]["rows_archived"] == deleted
    listed = [o for c in manifest["chunks"] if "archive" in c for o in c["archive"]["objects"]]
    assert sorted(o["sha256"] for o in listed) == sorted(o["sha256"] for o in objects)


def test_audit_verify_archives_catches_a_tampered_and_a_missing_object(drained, archive_dir):
    objects = _objects(drained)
    out, err = verify("--archives")
    assert err == "" and f"{len(objects)} archive object(s) match their digests" in out

    victim = archive_dir / objects[0]["name"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    _out, err = verify("--archives")
    assert f"archive object {objects[0]['name']}" in err and "differs from the chain's" in err
    assert verify()[1] == ""  # without --archives the chain alone still verifies

    (archive_dir / objects[1]["name"]).unlink()
    _out, err = verify("--archives")
    assert f"archive object {objects[1]['name']}" in err and "missing from" in err
