from __future__ import annotations

import csv
import io
import json

import pytest
from django.db import connection
from django.urls import reverse

from runs.engine import worker
from runs.evidence.audit import verify_chain
from runs.models import AuditRecord

from .helpers import rows_deleted

pytestmark = pytest.mark.django_db


def download(response) -> bytes:
    assert response.streaming, "exports must stream"
    return b"".join(response.streaming_content)


def read_csv(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(download(response).decode())))


def test_the_csv_export_has_one_line_per_audit_record(client_for, run):
    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export")))

    records = list(AuditRecord.objects.order_by("chain_seq"))
    assert [int(r["chain_seq"]) for r in rows] == [a.chain_seq for a in records]
    assert rows[0]["hash"] == records[0].hash
    assert rows[0]["run_key"] == run.run_key
    assert sum(int(r["rows_deleted"]) for r in rows) == rows_deleted(run)


def test_the_export_is_an_attachment(client_for, run):
    response = client_for("compliance").get(reverse("runs:audit_export") + "?policy=events")

    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="audit_events.csv"'


# Tenant values a spreadsheet would run as a formula (and one it would not), as a target
# table can hold them; the export neutralizes them in its SQL.
FORMULAS = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "=cmd|calc"]
PLAIN = "tenant-1"


def test_a_formula_in_the_data_is_neutralized_in_the_exported_csv(client_for, make_user):
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    values = [*FORMULAS, PLAIN]
    create_events(1600, tenants=len(values))  # tenant ids 1..8
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_events ALTER tenant_id TYPE text")
        for n, value in enumerate(values, start=1):
            cur.execute(
                "UPDATE public.rr_events SET tenant_id = %s WHERE tenant_id = %s", [value, str(n)]
            )
    policy = approved_policy(make_user, **events_spec())
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    worker.drain(created.pk, budget_s=60)
    assert set(AuditRecord.objects.values_list("tenant", flat=True)) == set(values)

    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export")))

    tenants = {r["tenant"] for r in rows}
    assert tenants == {"'" + v for v in FORMULAS} | {PLAIN}
    assert all(r["policy"] == "events" and r["run_key"] == created.run_key for r in rows)


def test_filters_narrow_the_export(client_for, run, make_user):
    from .conftest import make_dead_letter

    make_dead_letter(make_user, slug="gone")  # a second policy, no audit rows
    client = client_for("auditor")
    tenant = AuditRecord.objects.filter(run=run).values_list("tenant", flat=True).first()
    day = run.audit_records.first().committed_at.date()

    by_tenant = read_csv(client.get(reverse("runs:audit_export") + f"?tenant={tenant}"))
    by_run = read_csv(client.get(reverse("runs:audit_export") + f"?run={run.run_key}"))
    by_day = read_csv(client.get(reverse("runs:audit_export") + f"?from={day}&to={day}"))
    before = read_csv(client.get(reverse("runs:audit_export") + "?to=2000-01-01"))
    other = read_csv(client.get(reverse("runs:audit_export") + "?policy=gone"))

    assert by_tenant and {r["tenant"] for r in by_tenant} == {tenant}
    assert len(by_run) == run.audit_records.count() == len(by_day)
    assert before == [] and other == []


def test_the_audit_page_filters_and_links_the_exports(client_for, run):
    html = client_for("auditor").get(reverse("runs:audit") + f"?run={run.pk}").content.decode()

    assert f"{reverse('runs:audit_export')}?run={run.pk}" in html
    assert reverse("runs:manifest", args=[run.pk]) in html
    assert run.audit_records.first().hash[:12] in html


def test_the_manifest_holds_version_approval_cutoff_chunks_totals_and_chain_head(client_for, run):
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()

    response = client_for("auditor").get(reverse("runs:manifest", args=[run.pk]))

    assert response["Content-Disposition"].startswith('attachment; filename="events-')
    manifest = json.loads(download(response))
    version = run.policy_version
    assert manifest["run"]["run_key"] == run.run_key
    assert manifest["cutoff"] == run.cutoff.isoformat()
    assert manifest["policy_version"]["number"] == version.number
    assert manifest["policy_version"]["content_hash"] == version.content_hash
    assert manifest["approval"] == {
        "author": version.author.username,
        "submitted_at": version.submitted_at.isoformat(),
        "approver": version.decided_by.username,
        "approved_at": version.decided_at.isoformat(),
        "reason": version.decision_reason,
        "content_hash": version.approved_hash,
    }
    assert manifest["approval"]["author"] != manifest["approval"]["approver"]
    assert manifest["verification"] == run.verification
    assert manifest["totals"]["rows_deleted"] == rows_deleted(run)
    assert len(manifest["chunks"]) == run.chunks.count()
    done = [c for c in manifest["chunks"] if c["state"] == "done"]
    assert sum(c["rows_deleted"] for c in done) == manifest["totals"]["rows_deleted"]
    assert manifest["audit_chain"]["head_hash"] == verify_chain().head
    assert manifest["audit_chain"]["run_records"]["ok"] is True
    assert manifest["audit_chain"]["run_records"]["records_checked"] == len(done)


def test_viewer_and_oncall_may_not_export(client_for, run):
    for role in ("viewer", "oncall"):
        client = client_for(role)
        assert client.get(reverse("runs:audit_export")).status_code == 403
        assert client.get(reverse("runs:manifest", args=[run.pk])).status_code == 403
        assert client.get(reverse("runs:audit")).status_code == 403


def test_each_csv_row_names_the_approver_and_the_versions_content_hash(client_for, run):
    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export") + f"?run={run.pk}"))

    version = run.policy_version
    assert rows and {r["approved_by"] for r in rows} == {version.decided_by.username}
    assert {r["version_hash"] for r in rows} == {version.approved_hash}
    assert {r["policy_version"] for r in rows} == {str(version.number)}


def test_a_runs_files_are_named_by_its_run_key(client_for, run):
    client = client_for("auditor")
    safe = run.run_key.replace("/", "-").replace(":", "-")  # events-2026-11-30T12-00

    by_key = client.get(reverse("runs:audit_export") + f"?run={run.run_key}")
    by_id = client.get(reverse("runs:audit_export") + f"?run={run.pk}")
    manifest = client.get(reverse("runs:manifest", args=[run.pk]))

    assert by_key["Content-Disposition"] == f'attachment; filename="{safe}.csv"'
    assert by_id["Content-Disposition"] == f'attachment; filename="{safe}.csv"'
    assert manifest["Content-Disposition"] == f'attachment; filename="{safe}.manifest.json"'


def test_a_chunk_that_deleted_nothing_says_why_held_or_nothing_eligible(
    client_for, events_policy, make_user
):
    from retention.actions import place_hold
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.runs.conftest import NOW

    created, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(created)
    place_hold(
        policy=events_policy, tenant="3", actor=make_user("hilda", "compliance"), reason="case 7"
    )
    with connection.cursor() as cur:  # tenant 2's rows are gone before its chunks run
        cur.execute("DELETE FROM public.rr_events WHERE tenant_id = '2'")
    worker.drain(created.pk, budget_s=60)

    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export") + f"?run={created.pk}"))

    by_tenant = {}
    for r in rows:
        by_tenant.setdefault(r["tenant"], set()).add((r["outcome"], r["rows_deleted"]))
    assert by_tenant["3"] == {("held", "0")}
    assert by_tenant["2"] == {("nothing eligible", "0")}
    assert {o for o, n in by_tenant["1"]} == {"deleted"} and all(
        n != "0" for _, n in by_tenant["1"]
    )
    assert {r["recorded_outcome"] for r in rows} == {"deleted"}  # as hashed in the chain


def manifest_of(client, run) -> dict:
    return json.loads(download(client.get(reverse("runs:manifest", args=[run.pk]))))


def test_the_manifest_lists_the_holds_that_applied_and_the_operator_actions_on_the_run(
    client_for, run, users, make_user
):
    from retention.actions import place_hold
    from runs.actions import pause_run, resume_run
    from tests.factories import approved_policy, events_spec, release_hold
    from tests.runs.conftest import create_events

    hilda = make_user("hilda", "compliance")
    create_events(100, name="rr_other")
    other = approved_policy(make_user, **events_spec(slug="other", table="rr_other"))
    on_other = place_hold(policy=other, actor=hilda, reason="another policy's case")
    on_tenant = place_hold(policy=run.policy, tenant="3", actor=hilda, reason="case 7")
    everywhere = place_hold(actor=hilda, reason="board order")
    release_hold(everywhere, requester=hilda, approver=users["compliance"], reason="order lifted")
    pause_run(run, actor=users["oncall"], reason="db maintenance")
    resume_run(run, actor=users["oncall"], reason="maintenance over")

    manifest = manifest_of(client_for("auditor"), run)

    holds = {h["id"]: h for h in manifest["holds"]}
    assert set(holds) == {on_tenant.pk, everywhere.pk}  # not the other policy's
    assert holds[on_tenant.pk]["tenant"] == "3" and holds[on_tenant.pk]["reason"] == "case 7"
    assert holds[everywhere.pk]["policy"] is None
    released = holds[everywhere.pk]
    assert (released["release_requested_by"], released["released_by"]) == ("hilda", "carla")
    assert on_other.pk not in holds
    actions = [(a["action"], a["actor"], a["reason"]) for a in manifest["operator_actions"]]
    assert ("run.pause", users["oncall"].username, "db maintenance") in actions
    assert actions[-1] == ("run.resume", users["oncall"].username, "maintenance over")
    assert all(a["hash"] for a in manifest["operator_actions"])


def test_the_manifest_explains_the_gaps_in_a_runs_chain_sequence(client_for, run, make_user):
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    create_events(1000, name="rr_other")
    other_policy = approved_policy(make_user, **events_spec(slug="other", table="rr_other"))
    other, _ = trigger_run(other_policy, tick=NOW)
    planner.plan(other)
    for _ in range(2):  # this run, the other, this run, the other, this run
        assert worker.process_one(other).kind == worker.DONE
        assert worker.process_one(run).kind == worker.DONE

    chain = manifest_of(client_for("auditor"), run)["audit_chain"]

    seqs = list(run.audit_records.order_by("chain_seq").values_list("chain_seq", flat=True))
    assert chain["run_seq_ranges"] == [[seqs[0], seqs[2]], [seqs[3], seqs[3]], [seqs[4], seqs[4]]]
    assert chain["other_runs_records_between"] == 2
    assert chain["other_runs_between"] == [{"id": other.pk, "run_key": other.run_key, "records": 2}]
    assert "other runs" in chain["gaps_note"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "?tenant_id=3",
            "error: unknown filter 'tenant_id' (filters: policy, run, tenant, from, to)\n",
        ),
        ("?policy=evnets", "error: policy: no policy named 'evnets'\n"),
        ("?from=2026-12-02&to=2026-12-01", "error: from: 2026-12-02 is after to: 2026-12-01\n"),
        ("?tenant=1&tenant=2", "error: tenant: given more than once\n"),
    ],
)
def test_an_invalid_filter_on_the_export_is_one_clear_error_not_an_unfiltered_list(
    client_for, run, query, message
):
    response = client_for("auditor").get(reverse("runs:audit_export") + query)

    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == message


def test_the_manifest_says_which_chunks_were_held_or_had_nothing_eligible(
    client_for, events_policy, make_user
):
    from retention.actions import place_hold
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.runs.conftest import NOW

    created, _ = trigger_run(events_policy, tick=NOW)
    planner.plan(created)
    hilda = make_user("hilda", "compliance")
    place_hold(policy=events_policy, tenant="3", actor=hilda, reason="case 7")
    with connection.cursor() as cur:
        cur.execute("DELETE FROM public.rr_events WHERE tenant_id = '2'")
    worker.drain(created.pk, budget_s=60)

    chunks = manifest_of(client_for("auditor"), created)["chunks"]

    done = [c for c in chunks if c["state"] == "done"]
    assert {c["outcome"] for c in done if c["tenant"] == "3"} == {"held"}
    assert {c["outcome"] for c in done if c["tenant"] == "2"} == {"nothing eligible"}
    assert {c["outcome"] for c in done if c["tenant"] == "1"} == {"deleted"}
    assert all(c["outcome"] is None for c in chunks if c["state"] != "done")


def test_a_chunk_across_tenants_held_by_a_tenant_hold_is_reported_held(client_for, make_user):
    from retention.actions import place_hold
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    create_events(1000)
    with connection.cursor() as cur:  # every row is tenant 1's
        cur.execute("UPDATE public.rr_events SET tenant_id = 1")
    policy = approved_policy(make_user, **events_spec(chunking="key"))
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    place_hold(policy=policy, tenant="1", actor=make_user("hilda", "compliance"), reason="case 9")
    worker.drain(created.pk, budget_s=60)

    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export") + f"?run={created.pk}"))

    assert rows and {r["tenant"] for r in rows} == {""}  # chunks across tenants
    assert {(r["outcome"], r["rows_deleted"]) for r in rows} == {("held", "0")}


def test_the_csv_names_the_holds_in_force_and_counts_a_key_range_chunks_rows_per_tenant(
    client_for, make_user
):
    """What the manifest says per run, the CSV says per record: the holds in force when it
    committed, and for a chunk across tenants its rows per tenant."""
    from retention.actions import place_hold
    from runs.actions import trigger_run
    from runs.engine import planner
    from tests.factories import approved_policy, events_spec
    from tests.runs.conftest import NOW, create_events

    create_events(3000)
    policy = approved_policy(make_user, **events_spec(chunking="key"))
    hold = place_hold(
        policy=policy, tenant="3", actor=make_user("hilda", "compliance"), reason="case 7"
    )
    created, _ = trigger_run(policy, tick=NOW)
    planner.plan(created)
    worker.drain(created.pk, budget_s=60)

    rows = read_csv(client_for("auditor").get(reverse("runs:audit_export") + f"?run={created.pk}"))

    assert rows and all(r["holds"] == str(hold.pk) for r in rows)
    per_tenant: dict[str, int] = {}
    for r in rows:
        counts = json.loads(r["tenant_rows"])
        assert sum(counts.values()) == int(r["rows_deleted"])
        for tenant, n in counts.items():
            per_tenant[tenant] = per_tenant.get(tenant, 0) + n
    with connection.cursor() as cur:
        cur.execute(
            "SELECT s.tenant_id::text, count(*) FROM public.rr_events_shadow s WHERE NOT EXISTS"
            " (SELECT 1 FROM public.rr_events e WHERE e.id = s.id) GROUP BY 1"
        )
        assert per_tenant == dict(cur.fetchall())
