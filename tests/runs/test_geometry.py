"""Chunk geometry: what a run's chunks run along is chosen from the table (``chunking =
"auto"``), recorded on the run at creation, shown by the preview, ``retention explain`` and
the run page; key-range chunks across interleaved tenants drain exactly, keep holds by
tenant, report rows per tenant, and hand concurrent workers disjoint heap pages."""

from __future__ import annotations

from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from retention import actions as retention_actions
from retention import geometry
from retention import predicate as P
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.audit import TENANT_ROWS_CHAIN_VERSION, verify_chain
from runs.evidence.invariants import HoldScope, Shadow, check_run
from runs.models import AuditRecord, Chunk, Run
from runs.progress import progress_for
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events


def _clustered(rows: int = 3000, tenants: int = 5) -> None:
    """``public.rr_events`` rewritten with each tenant's rows together on the heap."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE public.rr_tmp AS SELECT * FROM public.rr_events")
        cur.execute("TRUNCATE public.rr_events")
        cur.execute(
            "INSERT INTO public.rr_events SELECT * FROM public.rr_tmp ORDER BY tenant_id, id"
        )
        cur.execute("DROP TABLE public.rr_tmp")
        cur.execute("DROP TABLE public.rr_events_shadow")
        cur.execute("CREATE TABLE public.rr_events_shadow AS SELECT * FROM public.rr_events")
        cur.execute("ANALYZE public.rr_events")


@pytest.fixture
def interleaved(db, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_events(6000, tenants=5)  # tenants g % 5 on every heap page
    return "public.rr_events"


def _policy(make_user, **overrides):
    fields = events_spec(**overrides)
    fields.pop("chunking", None)  # auto, unless a test pins it
    fields.update({k: v for k, v in overrides.items() if k == "chunking"})
    return approved_policy(make_user, **fields)


def _deleted_by_tenant() -> dict[str, int]:
    """Rows of the shadow copy gone from ``rr_events``, per tenant as text."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT s.tenant_id::text, count(*) FROM public.rr_events_shadow s"
            " LEFT JOIN public.rr_events e ON e.id = s.id WHERE e.id IS NULL GROUP BY 1"
        )
        return dict(cur.fetchall())


def _pages_per_chunk(run: Run) -> list[set[int]]:
    spec = run.policy_version.parsed
    out = []
    for chunk in Chunk.objects.filter(run=run).order_by("seq", "id"):
        lo, hi = chunk.bounds()
        tenant = chunk.tenant if run.per_tenant(spec) else None
        scope = P.in_scope(spec, tenant=tenant, key_from=lo, key_to=hi)
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT DISTINCT (ctid::text::point)[0]::int FROM {P.table(spec).as_string(cur.connection)}"
                f" WHERE {scope.sql.as_string(cur.connection)} AND occurred_at < %s",
                [*scope.params, run.cutoff],
            )
            out.append({row[0] for row in cur.fetchall()})
    return out


def test_interleaved_tenants_get_key_range_chunks_that_drain_exactly_and_report_per_tenant(
    interleaved, make_user, client
):
    policy = _policy(make_user)
    shape = geometry.choose(policy.approved_version.parsed)
    assert shape.kind == "key"
    assert "tenants interleave on 100% of" in shape.reason
    # a hold on tenant 3 stays inside every DELETE, whatever the geometry
    keeper = make_user("keeper", "compliance")
    retention_actions.place_hold(actor=keeper, reason="litigation", policy=policy, tenant="3")

    run, _ = trigger_run(policy, tick=NOW)
    assert (run.chunking, run.chunking_reason) == ("key", shape.reason)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_events_shadow"), holds=[HoldScope("3")]) == []
    assert set(Chunk.objects.filter(run=run).values_list("tenant", flat=True)) == {""}

    records = list(AuditRecord.objects.filter(run=run))
    assert {r.chain_version for r in records} == {TENANT_ROWS_CHAIN_VERSION}
    assert all(sum(r.tenant_rows.values()) == r.rows_deleted for r in records)
    assert verify_chain().ok
    # per-tenant rows deleted, from the audit rows, agree with the table
    gone = _deleted_by_tenant()
    audited = Counter()
    for r in records:
        audited.update(r.tenant_rows)
    assert dict(audited) == gone and "3" not in gone
    by_tenant = {
        t.tenant: t.rows_deleted for t in progress_for([run], now=timezone.now())[run.pk].tenants
    }
    assert {k: v for k, v in by_tenant.items() if v} == gone

    # the run page and retention explain say what was chosen and why
    admin = make_user("viewer", "oncall")
    client.force_login(admin)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "tenants interleave on 100% of" in html
    out = StringIO()
    call_command("retention", "explain", policy.slug, stdout=out)
    assert out.getvalue().splitlines()[0] == f"== chunking: key — {shape.reason}"


def test_key_range_chunks_over_a_time_ordered_key_do_not_share_heap_pages(interleaved, make_user):
    """What lets two workers scale: concurrent chunks touch different pages. Per-tenant chunks
    over the same interleaved table share nearly every page."""
    key_run, _ = trigger_run(_policy(make_user), tick=NOW)
    planner.plan(key_run, window=1000)
    per_tenant, _ = trigger_run(_policy(make_user, slug="by-tenant", chunking="tenant"), tick=NOW)
    planner.plan(per_tenant, window=1000)
    assert per_tenant.chunking == "tenant"

    def shared(pages: list[set[int]]) -> int:
        seen = Counter(p for chunk in pages for p in chunk)
        return max(seen.values())

    key_pages = _pages_per_chunk(key_run)
    assert len(key_pages) > 5
    assert shared(key_pages) <= 2  # at most the page where one chunk ends and the next begins
    assert shared(_pages_per_chunk(per_tenant)) >= 5  # every tenant's chunk reads the page


def test_clustered_tenants_with_a_tenant_key_index_get_per_tenant_chunks(interleaved, make_user):
    _clustered()
    policy = _policy(make_user)
    shape = geometry.choose(policy.approved_version.parsed)
    assert shape.kind == "tenant" and "tenants cluster" in shape.reason
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    assert check_run(run, shadow=Shadow("public", "rr_events_shadow")) == []
    assert len(set(Chunk.objects.filter(run=run).values_list("tenant", flat=True))) == 5


def test_the_policy_can_pin_the_geometry_and_without_the_index_auto_takes_key_ranges(
    interleaved, make_user
):
    pinned = _policy(make_user, slug="pinned", chunking="tenant")
    assert geometry.choose(pinned.approved_version.parsed).reason == (
        'per-tenant chunks (chunking = "tenant")'
    )
    with connection.cursor() as cur:
        cur.execute("DROP INDEX public.rr_events_tenant_id_id_idx")
    spec = _policy(make_user, slug="no-index").approved_version.parsed
    assert geometry.choose(spec) == geometry.Geometry(
        "key", "no (tenant_id, id) index: key-range chunks"
    )


@pytest.mark.parametrize("kind", ["int", "numeric"])
def test_the_rows_deleted_per_tenant_are_counted_by_the_tenants_text(interleaved, make_user, kind):
    """A chunk across tenants counts its rows per tenant. An integer tenant is grouped by its
    value (the text of equal integers is one text); a numeric one by its text: 2.0 and 2.00
    are equal numbers that an auditor reads as two tenants, and each keeps its own count."""
    if kind == "numeric":
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE public.rr_events ALTER tenant_id TYPE numeric")
            cur.execute(
                "UPDATE public.rr_events SET tenant_id = 2.00 WHERE tenant_id = 2 AND id / 4 % 2 = 0"
            )
            cur.execute(
                "UPDATE public.rr_events SET tenant_id = 2.0 WHERE tenant_id = 2 AND id / 4 % 2 = 1"
            )
            cur.execute("DROP TABLE public.rr_events_shadow")
            cur.execute("CREATE TABLE public.rr_events_shadow AS SELECT * FROM public.rr_events")
            cur.execute("ANALYZE public.rr_events")
    policy = _policy(make_user, chunking="key")
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED
    gone = _deleted_by_tenant()
    audited = Counter()
    for r in AuditRecord.objects.filter(run=run):
        audited.update(r.tenant_rows)
    assert dict(audited) == gone
    assert {"2.0", "2.00"} <= set(gone) if kind == "numeric" else "2" in gone
