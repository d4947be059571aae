"""Partition-aware runs on a real range-partitioned table (monthly partitions): a partition
wholly past the cutoff with nothing kept or held is detached and dropped (or left detached)
and audited in the same hash chain; one with a held tenant or a kept row is deleted in chunks
and those rows survive; a hold that commits before the detach wins. docs/engine.md,
"Partitions"."""

from __future__ import annotations

import csv
import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from core.models import OperatorAction
from retention import actions as retention_actions
from retention import introspect
from retention.preview import preview
from retention.spec import PolicySpec, SpecError
from runs.actions import set_kill_switch, trigger_run
from runs.engine import worker
from runs.engine.reconciler import reconcile
from runs.evidence import exports
from runs.evidence.audit import HASHED_COLUMNS, record_hash, verify_chain
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, GuardSample, PartitionAction, PlannerCursor, Run
from runs.progress import progress_for
from tests.factories import approved_policy, events_spec, release_hold
from tests.runs.conftest import NOW, count
from tests.runs.processes import pg_connect, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

MONTHS = [f"2026_{m:02d}" for m in range(1, 13)]
EXPIRED = MONTHS[:7]  # retention 120 days before 2026-11-30 12:00: cutoff 2026-08-02 12:00


def create_partitioned(name: str = "rr_parts", rows: int = 6000, *, default: bool = False,
                       on: str = "occurred_at") -> None:  # fmt: skip
    """``public.<name>``: 12 monthly partitions of 2026 (``<name>_2026_MM``); ``rows`` rows
    from 2026-01-01 to NOW, ids increasing with time, tenants 1–4; a few 'disputed' rows in
    March only. Shadow copy beside it."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}, public.{name}_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.{name}_{month}")
        cur.execute(
            f"CREATE TABLE public.{name} (id bigint NOT NULL, tenant_id int NOT NULL,"
            f" occurred_at timestamptz NOT NULL, status text, payload text)"
            f" PARTITION BY RANGE ({on})"
        )
        for i, month in enumerate(MONTHS):
            if on == "occurred_at":
                nxt = "2027-01-01" if i == 11 else f"2026-{i + 2:02d}-01"
                lo, hi = f"'2026-{i + 1:02d}-01 00:00+00'", f"'{nxt} 00:00+00'"
            else:
                lo, hi = str(i * rows // 11 + 1), str((i + 1) * rows // 11 + 1)
            cur.execute(
                f"CREATE TABLE public.{name}_{month} PARTITION OF public.{name}"
                f" FOR VALUES FROM ({lo}) TO ({hi})"
            )
        if default:
            cur.execute(f"CREATE TABLE public.{name}_default PARTITION OF public.{name} DEFAULT")
        cur.execute(
            f"""INSERT INTO public.{name}
                SELECT g, 1 + g %% 4,
                       '2026-01-01 00:00+00'::timestamptz
                         + (%s::timestamptz - '2026-01-01 00:00+00'::timestamptz) * (g - 1)::float8 / %s,
                       'closed', repeat('x', 40)
                FROM generate_series(1, %s) AS g""",
            [NOW, rows, rows],
        )
        cur.execute(
            f"UPDATE public.{name} SET status = 'disputed' WHERE id % 97 = 0"
            f" AND occurred_at >= '2026-03-01 00:00+00' AND occurred_at < '2026-04-01 00:00+00'"
        )
        cur.execute(f"CREATE INDEX ON public.{name} (tenant_id, id)")
        cur.execute(f"CREATE TABLE public.{name}_shadow AS SELECT * FROM public.{name}")
        cur.execute(f"ANALYZE public.{name}")


@pytest.fixture
def parts(transactional_db, settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned()
    yield "rr_parts"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")
        for month in MONTHS:
            cur.execute(f"DROP TABLE IF EXISTS public.rr_parts_{month}")


def parts_spec(**overrides) -> dict:
    return events_spec(slug="parts", table="rr_parts", retention="120 days", **overrides)


def relation_exists(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [f"public.{name}"])
        return cur.fetchone()[0]


def attached(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s)"
            " AND inhparent = 'public.rr_parts'::regclass)",
            [f"public.{name}"],
        )
        return cur.fetchone()[0]


def shadow_month(month: str, what: str = "count(*)") -> object:
    y, m = month.split("_")
    nxt = f"{int(y) + 1}-01-01" if m == "12" else f"{y}-{int(m) + 1:02d}-01"
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT {what} FROM public.rr_parts_shadow"
            f" WHERE occurred_at >= %s::timestamptz AND occurred_at < %s::timestamptz",
            [f"{y}-{m}-01 00:00+00", f"{nxt} 00:00+00"],
        )
        return cur.fetchone()[0]


def drain(run: Run) -> Run:
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    return run


def test_expired_partitions_with_nothing_kept_or_held_are_dropped_and_audited(parts, make_user):
    policy = approved_policy(make_user, **parts_spec())
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason

    dropped = {a.name: a for a in PartitionAction.objects.filter(run=run, state="dropped")}
    # March has kept ('disputed') rows: deleted in chunks; August straddles the cutoff
    assert sorted(dropped) == [f"rr_parts_{m}" for m in EXPIRED if m != "2026_03"]
    # the blast-radius count (expected rows) and progress count dropped rows as deleted rows
    audited = sum(AuditRecord.objects.filter(run=run).values_list("rows_deleted", flat=True))
    assert run.expected_rows == audited
    assert progress_for([run.pk], now=timezone.now())[run.pk].rows_deleted == audited
    # no default partition and no transaction block around the worker: detached concurrently
    assert all(a.concurrently for a in dropped.values())
    for month in EXPIRED:
        assert relation_exists(f"rr_parts_{month}") == (month == "2026_03")
    assert count("rr_parts", "status = 'disputed'") == shadow_month(
        "2026_03", "count(*) FILTER (WHERE status = 'disputed')"
    )

    records = {
        r.partition["name"]: r for r in AuditRecord.objects.filter(run=run, outcome="dropped")
    }
    assert sorted(records) == sorted(f"public.{n}" for n in dropped)
    for name, record in records.items():
        month = name.removeprefix("public.rr_parts_")
        assert record.rows_deleted == record.partition["rows"] == shadow_month(month)
        digest = shadow_month(month, "md5(string_agg(id::text, ',' ORDER BY id))")
        assert record.partition["digest"] == f"md5:{digest}"
        assert record.partition["bounds"].startswith("FOR VALUES FROM ('2026-")
        assert record.chain_version == 3
    # the rest went in chunks; the chain, the ledger and the shadow agree
    assert AuditRecord.objects.filter(run=run, outcome="deleted").exists()
    assert verify_chain().ok
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []

    # the hash covers the partition's facts: another digest would not verify
    row = (
        AuditRecord.objects.filter(pk=records["public.rr_parts_2026_01"].pk)
        .values(*HASHED_COLUMNS)
        .get()
    )
    assert record_hash(row, row["prev_hash"]) == row["hash"]
    forged = {**row, "partition": {**row["partition"], "digest": "md5:" + "0" * 32}}
    assert record_hash(forged, row["prev_hash"]) != row["hash"]

    # the operators' commands: retention check (against the shadow) and audit verify
    out = StringIO()
    call_command("retention", "check", run.run_key, "--shadow", "public.rr_parts_shadow",
                 stdout=out, stderr=StringIO())  # fmt: skip
    assert "every invariant holds" in out.getvalue()
    out = StringIO()
    call_command("retention", "audit", "verify", stdout=out, stderr=StringIO())
    assert out.getvalue().startswith("audit chain intact"), out.getvalue()

    # the CSV export and the run manifest show each partition action
    text = b"".join(exports.csv_rows(exports.AuditFilters(run=str(run.pk)))).decode()
    lines = list(csv.DictReader(io.StringIO(text)))
    jan = next(r for r in lines if r["partition"] == "public.rr_parts_2026_01")
    assert (jan["outcome"], jan["partition_rows"], jan["partition_digest"]) == (
        "dropped", str(records["public.rr_parts_2026_01"].rows_deleted),
        records["public.rr_parts_2026_01"].partition["digest"],
    )  # fmt: skip
    assert jan["partition_bounds"].startswith("FOR VALUES FROM")
    manifest = json.loads("".join(exports.manifest_json(run)))
    assert sorted(
        p["partition"] for p in manifest["partitions"] if p["state"] == "dropped"
    ) == sorted(records)
    assert manifest["audit_chain"]["run_records"]["ok"]
    assert any(c["partition"] and c["pass"] == 0 for c in manifest["chunks"])


def test_detach_mode_leaves_expired_partitions_detached_with_their_rows(parts, make_user):
    policy = approved_policy(make_user, **parts_spec(partition_action="detach", keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    detached = PartitionAction.objects.filter(run=run, state="detached")
    assert sorted(a.name for a in detached) == [f"rr_parts_{m}" for m in EXPIRED]
    for month in EXPIRED:
        assert relation_exists(f"rr_parts_{month}") and not attached(f"rr_parts_{month}")
        assert count(f"public.rr_parts_{month}") == shadow_month(month)
    assert AuditRecord.objects.filter(run=run, outcome="detached").count() == 7
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []

    # the checker reads the detached tables: a row slipped into one breaks its digest
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_parts_2026_02 VALUES (999999, 1, '2026-02-02', 'closed', '')"
        )
    problems = check_run(run)
    assert any("rr_parts_2026_02" in p and "digest" in p for p in problems), problems


def test_an_expired_partition_with_one_held_tenant_is_deleted_in_chunks_and_the_held_rows_survive(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    with connection.cursor() as cur:
        cur.execute("SELECT min(id), max(id) + 1 FROM public.rr_parts_2026_04")
        lo, hi = cur.fetchone()
    keeper = make_user("kim", "compliance")
    retention_actions.place_hold(actor=keeper, reason="litigation", policy=policy, tenant="3",
                                 key_from=lo, key_to=hi)  # fmt: skip
    held = count("rr_parts_2026_04", "tenant_id = 3")
    assert held > 0
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert relation_exists("rr_parts_2026_04") and attached("rr_parts_2026_04")
    assert count("rr_parts_2026_04") == held  # only the held tenant's rows are left
    names = set(
        PartitionAction.objects.filter(run=run, state="dropped").values_list("name", flat=True)
    )
    assert names == {f"rr_parts_{m}" for m in EXPIRED if m != "2026_04"}
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_a_hold_that_commits_while_the_detach_waits_for_the_fence_wins(parts, make_user):
    policy = approved_policy(
        make_user, **parts_spec(keep=[], timeouts={"lock_ms": 8000, "statement_ms": 8000})
    )
    run, _ = trigger_run(policy, tick=NOW)
    keeper = make_user("kim", "compliance")
    placed, release = threading.Event(), threading.Event()

    def hold_open():
        try:
            with transaction.atomic():
                retention_actions.place_hold(
                    actor=keeper, reason="subpoena", policy=policy, tenant="2"
                )
                placed.set()
                release.wait(60)
        finally:
            connection.close()

    def run_drain():
        try:
            return worker.drain(run.pk, budget_s=120)
        finally:
            connection.close()

    observer = pg_connect()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            hold = pool.submit(hold_open)
            assert placed.wait(30)
            drained = pool.submit(run_drain)
            # the run waits for the global fence the uncommitted hold holds exclusive
            wait_for(lambda: observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event = 'advisory'").fetchone()[0],
                what="the detach to wait for the fence")  # fmt: skip
            assert not PartitionAction.objects.filter(run=run).exists()
            release.set()
            hold.result(timeout=60)
            drained.result(timeout=180)
    finally:
        release.set()
        observer.close()
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    # every expired partition holds tenant 2's rows: none is dropped, the held rows survive
    assert not PartitionAction.objects.filter(run=run, state="dropped").exists()
    for month in EXPIRED:
        assert attached(f"rr_parts_{month}")
        assert (
            count(f"public.rr_parts_{month}")
            == count(f"public.rr_parts_{month}", "tenant_id = 2")
            > 0
        )
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_the_default_partition_is_never_dropped_and_is_deleted_in_chunks(
    transactional_db, settings, make_user
):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned(default=True)
    with connection.cursor() as cur:  # old rows outside every monthly range land in the default
        cur.execute(
            "INSERT INTO public.rr_parts VALUES (-5, 1, '2025-06-01', 'closed', ''), (-4, 2, '2025-07-01', 'closed', '')"
        )
    try:
        policy = approved_policy(make_user, **parts_spec(keep=[]))
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert relation_exists("rr_parts_default") and count("rr_parts_default") == 0
        names = set(
            PartitionAction.objects.filter(run=run, state="dropped").values_list("name", flat=True)
        )
        assert names == {f"rr_parts_{m}" for m in EXPIRED}
        assert not any(a.concurrently for a in PartitionAction.objects.filter(run=run))
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_a_key_partitioned_table_drops_partitions_whose_rows_are_all_expired(
    transactional_db, settings, make_user
):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    create_partitioned(on="id")
    try:
        policy = approved_policy(make_user, **parts_spec(keep=[]))
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        dropped = PartitionAction.objects.filter(run=run, state="dropped")
        assert dropped.exists()
        for action in dropped:
            assert not relation_exists(action.name)
        assert check_run(run, shadow=("public", "rr_parts_shadow")) == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_parts, public.rr_parts_shadow CASCADE")


def test_a_sub_partitioned_table_is_refused_with_one_clear_error(transactional_db):
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_nested (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text) PARTITION BY RANGE (occurred_at);"
            "CREATE TABLE public.rr_nested_2026 PARTITION OF public.rr_nested"
            " FOR VALUES FROM ('2026-01-01') TO ('2027-01-01') PARTITION BY LIST (tenant_id);"
            "CREATE TABLE public.rr_nested_2026_t1 PARTITION OF public.rr_nested_2026 FOR VALUES IN (1)"
        )
    try:
        spec = PolicySpec.parse(events_spec(slug="nested", table="rr_nested", keep=[]))
        with pytest.raises(SpecError, match="sub-partitioned"):
            introspect.validate(spec)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_nested CASCADE")


def test_a_table_pg_partman_manages_is_refused_naming_the_tool_that_owns_retention(
    transactional_db,
):
    with connection.cursor() as cur:
        try:
            with transaction.atomic():
                cur.execute("CREATE SCHEMA IF NOT EXISTS partman")
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman")
        except Exception as exc:  # noqa: BLE001 - any failure means the server lacks it
            pytest.skip(f"pg_partman is not installable on this server: {str(exc).splitlines()[0]}")
        cur.execute(
            "CREATE TABLE public.rr_pm (id bigint NOT NULL, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text) PARTITION BY RANGE (occurred_at)"
        )
        cur.execute(
            "SELECT partman.create_parent('public.rr_pm', 'occurred_at', 'native', 'monthly')"
        )
    try:
        spec = PolicySpec.parse(events_spec(slug="pm", table="rr_pm", keep=[]))
        with pytest.raises(
            SpecError, match=r"managed by pg_partman \(partman\.part_config lists it\)"
        ):
            introspect.validate(spec)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_pm CASCADE")
            cur.execute("DROP EXTENSION IF EXISTS pg_partman CASCADE")
            cur.execute("DROP SCHEMA IF EXISTS partman CASCADE")


def test_the_preview_and_the_run_page_show_each_partition_and_its_action(parts, make_user, client):
    policy = approved_policy(make_user, **parts_spec())
    spec = policy.versions.get(state="approved").parsed
    result = preview(spec, policy_id=policy.pk, now=NOW)
    actions = {p["partition"].removeprefix("public.rr_parts_"): p for p in result["partitions"]}
    for month in EXPIRED:
        assert actions[month]["past_cutoff"]
        assert actions[month]["rows"] == shadow_month(month)
    assert actions["2026_03"]["action"].startswith("chunks (0 held, ")
    assert actions["2026_03"]["kept"] > 0
    assert actions["2026_08"]["action"] == "chunks (straddles the cutoff)"
    assert actions["2026_10"]["action"] == "none (newer)"
    assert {m for m, p in actions.items() if p["action"] == "drop"} == set(EXPIRED) - {"2026_03"}
    # dropped rows count like deleted ones: they are part of the eligible rows
    taken = sum(shadow_month(m) for m in EXPIRED if m != "2026_03")
    assert result["rows_taken_whole"] == taken and result["eligible"] > taken

    run, _ = trigger_run(policy, tick=NOW)
    drain(run)
    client.force_login(make_user("vera", "viewer"))
    page = client.get(reverse("runs:detail", args=[run.pk])).content.decode()
    assert 'data-testid="partition-actions"' in page
    for month in EXPIRED:
        if month != "2026_03":
            assert f'data-partition="public.rr_parts_{month}"' in page
    assert page.count(">dropped") >= 6


def test_the_preview_says_when_a_held_tenant_in_every_partition_blocks_every_drop_and_the_cost(
    parts, make_user, client
):
    """Tenant 1 has rows in every month: a hold on it leaves no expired partition to drop, and
    the preview says so, with what it costs: the expired rows go row by row in chunks."""
    policy = approved_policy(make_user, **parts_spec())
    officer = make_user("hilda", "compliance")
    retention_actions.place_hold(actor=officer, reason="case 1", policy=policy, tenant="1")
    spec = policy.versions.get(state="approved").parsed
    result = preview(spec, policy_id=policy.pk, now=NOW)
    expired = [p for p in result["partitions"] if p["past_cutoff"]]
    assert len(expired) == len(EXPIRED) and not result["rows_taken_whole"]
    rows = sum(p["eligible"] for p in expired)
    chunks = -(-rows // spec.chunk_size)
    assert result["partition_note"] == (
        f"No partition past the cutoff can be dropped whole: legal holds cover rows in all "
        f"{len(EXPIRED)} of them (keep rules in 1). Their {rows:,} eligible rows are deleted "
        f"row by row instead, in about {chunks:,} chunks, rather than with {len(EXPIRED)} "
        f"partition drops."
    )
    # the command previews as of the wall clock, whose cutoff leaves NOW's behind (more months
    # past it, more rows): it prints the note of a preview taken now, of the same kind
    out = io.StringIO()
    call_command("retention", "policy", "preview", policy.slug, stdout=out)
    live_note = preview(spec, policy_id=policy.pk)["partition_note"]
    assert live_note.startswith("No partition past the cutoff can be dropped whole: legal holds")
    assert live_note in out.getvalue()
    client.force_login(officer)
    version = policy.approved_version
    live = client.get(  # "preview as of now" on the version page
        reverse("retention:version_preview", args=[policy.slug, version.number])
    ).content.decode()
    assert "No partition past the cutoff can be dropped whole" in live


def _interrupted_after_detach(run: Run, month: str) -> None:
    """What a worker killed between the detach and the drop transaction leaves behind."""
    PartitionAction.objects.create(run=run, schema="public", name=f"rr_parts_{month}",
                                   bounds=_bounds(month), action="drop")  # fmt: skip
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE public.rr_parts DETACH PARTITION public.rr_parts_{month}")


def _bounds(month: str) -> str:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = %s::regclass",
            [f"public.rr_parts_{month}"],
        )
        return cur.fetchone()[0]


def test_a_detach_interrupted_before_the_drop_is_finished_and_audited_by_the_next_attempt(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    _interrupted_after_detach(run, "2026_01")
    # meanwhile January's rows are out of the table's sight but not gone: moved to the detached
    # table its intent names, unaudited until its drop commits with the audit record
    assert count("public.rr_parts_2026_01") == shadow_month("2026_01")
    assert check_run(run, shadow=("public", "rr_parts_shadow"), expect_drained=False) == []
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    action = PartitionAction.objects.get(run=run, name="rr_parts_2026_01")
    assert action.state == "dropped" and not relation_exists("rr_parts_2026_01")
    assert action.chunk.audit.rows_deleted == shadow_month("2026_01")
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_a_hold_that_commits_while_a_detach_was_interrupted_puts_the_partition_back(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    _interrupted_after_detach(run, "2026_02")
    keeper = make_user("kim", "compliance")
    retention_actions.place_hold(actor=keeper, reason="audit", policy=policy, tenant="4")
    held = count("public.rr_parts_2026_02", "tenant_id = 4")
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    action = PartitionAction.objects.get(run=run, name="rr_parts_2026_02")
    assert action.state == "left" and "attached again" in action.note
    assert attached("rr_parts_2026_02")
    assert (
        count("public.rr_parts_2026_02")
        == count("public.rr_parts_2026_02", "tenant_id = 4")
        == held
    )
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def test_a_partitioned_tables_vacuum_note_counts_the_dead_tuples_its_chunks_left(parts, make_user):
    """A held tenant keeps every partition attached: the chunks delete the other rows of each
    leaf, and the dead tuples they leave are counted (dropped partitions leave none)."""
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    keeper = make_user("kim", "compliance")
    retention_actions.place_hold(actor=keeper, reason="audit", policy=policy, tenant="4")
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    chunk_rows = sum(
        AuditRecord.objects.filter(run=run, partition__isnull=True).values_list(
            "rows_deleted", flat=True
        )
    )
    assert chunk_rows > 1000
    # at least the rows the chunks deleted, from the ledger; more only when PostgreSQL's
    # statistics count more on the leaves (runs.engine.maintenance), as they did by 6 on a
    # machine under stress-ng; never fewer
    dead = run.verification["dead_tuples"]
    assert chunk_rows <= dead <= chunk_rows + 100, (dead, chunk_rows)
    assert run.verification["vacuum_note"] == (
        f"recommended: VACUUM (ANALYZE) public.rr_parts ({dead:,} dead tuples)"
    )


def test_the_kill_switch_stops_the_partition_step_like_a_chunk_and_nothing_is_dropped(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    olga = make_user("olga", "oncall")
    set_kill_switch(True, actor=olga, reason="drill")
    stats = worker.drain(run.pk, budget_s=30)
    assert stats["stopped"] == "global kill switch is on" and not stats["continue"]
    assert not PartitionAction.objects.filter(run=run).exists()
    assert all(attached(f"rr_parts_{m}") for m in EXPIRED)
    set_kill_switch(False, actor=olga, reason="drill over")
    assert drain(run).state == Run.State.DRAINED
    assert PartitionAction.objects.filter(run=run, state="dropped").count() == 7


def test_the_guard_holds_the_partition_step_back_and_the_planner_waits_for_it(
    parts, make_user, settings
):
    settings.RETENTION = {**settings.RETENTION, "GUARD": True}
    policy = approved_policy(make_user, **parts_spec(keep=[], guard={"lock_waits": 10}))
    run, _ = trigger_run(policy, tick=NOW)
    calm = {"lock_waits": 0, "replication_lag_s": 0.0, "connections_free": 100, "wal_mb_per_s": 0.0}
    GuardSample.objects.create(values={**calm, "lock_waits": 14}, tables={})
    stats = worker.drain(run.pk, budget_s=30, until_idle=True)
    assert stats["stopped"] == "idle: partitions postponed"
    assert not PartitionAction.objects.filter(run=run).exists()
    assert not PlannerCursor.objects.filter(run=run).exists()  # nothing planned as chunks
    GuardSample.objects.create(values=calm, tables={})
    assert drain(run).state == Run.State.DRAINED
    assert PartitionAction.objects.filter(run=run, state="dropped").count() == 7


def test_with_a_key_that_is_not_one_integer_column_no_partition_goes_whole(parts, make_user):
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE public.rr_parts ADD COLUMN ref text")
        cur.execute("UPDATE public.rr_parts SET ref = lpad(id::text, 8, '0')")
        cur.execute("ALTER TABLE public.rr_parts ALTER COLUMN ref SET NOT NULL")
        cur.execute("CREATE INDEX ON public.rr_parts (tenant_id, ref)")
    spec = PolicySpec.parse(parts_spec(key="ref", keep=[]))
    warnings = introspect.validate(spec).warnings
    assert any(
        "not one integer column" in w and "every row is deleted in chunks" in w for w in warnings
    )
    policy = approved_policy(make_user, **parts_spec(key="ref", keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    assert drain(run).state == Run.State.DRAINED
    assert not PartitionAction.objects.filter(run=run).exists()
    assert all(attached(f"rr_parts_{m}") and count(f"public.rr_parts_{m}") == 0 for m in EXPIRED)


def test_a_concurrent_detach_cut_short_in_its_second_phase_is_finalized_by_the_next_attempt(
    parts, make_user
):
    policy = approved_policy(make_user, **parts_spec(keep=[]))
    run, _ = trigger_run(policy, tick=NOW)
    PartitionAction.objects.create(run=run, schema="public", name="rr_parts_2026_05",
                                   bounds=_bounds("2026_05"), action="drop", concurrently=True)  # fmt: skip
    old_snapshot = pg_connect(autocommit=False)
    detacher = pg_connect()
    try:  # a transaction that read the parent makes the detach wait in its second phase
        old_snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        old_snapshot.execute("SELECT count(*) FROM public.rr_parts")
        detacher.execute("SET statement_timeout = '1s'")
        with pytest.raises(Exception, match="statement timeout"):
            detacher.execute(
                "ALTER TABLE public.rr_parts DETACH PARTITION public.rr_parts_2026_05 CONCURRENTLY"
            )
    finally:
        old_snapshot.rollback()
        old_snapshot.close()
        detacher.close()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'public.rr_parts_2026_05'::regclass"
        )
        assert cur.fetchone() == (True,)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    action = PartitionAction.objects.get(run=run, name="rr_parts_2026_05")
    assert action.state == "dropped" and not relation_exists("rr_parts_2026_05")
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []


def _detach_run(make_user, keep: str = "30 days") -> Run:
    policy = approved_policy(
        make_user, **parts_spec(partition_action="detach", detached_keep=keep, keep=[])
    )
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert PartitionAction.objects.filter(run=run, state="detached").count() == len(EXPIRED)
    return run


def _age(run: Run, names: list[str], days: int) -> None:
    PartitionAction.objects.filter(run=run, name__in=names).update(
        done_at=timezone.now() - timedelta(days=days)
    )


def test_the_reconciler_drops_detached_tables_past_detached_keep_and_keeps_the_younger(
    parts, make_user
):
    run = _detach_run(make_user)
    old = [f"rr_parts_{m}" for m in EXPIRED[:3]]
    _age(run, old, 31)
    _age(run, [f"rr_parts_{EXPIRED[3]}"], 29)
    report = reconcile()
    assert sorted(report["detached"]) == [f"public.{n}: dropped" for n in old], report
    for name in old:
        assert not relation_exists(name)
    for month in EXPIRED[3:]:
        assert relation_exists(f"rr_parts_{month}") and not attached(f"rr_parts_{month}")
        assert count(f"public.rr_parts_{month}") == shadow_month(month)
    # the ledger says so (its state stays what the audit record names), the operator log too
    dropped = PartitionAction.objects.filter(run=run, dropped_at__isnull=False)
    assert sorted(a.name for a in dropped) == old
    assert all(a.state == "detached" and "after 30 days" in a.note for a in dropped)
    ops = OperatorAction.objects.filter(action="partition.drop_detached")
    assert sorted(o.details["partition"] for o in ops) == [f"public.{n}" for n in old]
    assert all(o.actor == "reconciler" and o.details["detached_keep"] == "30 days" for o in ops)
    # no second audit record for rows audited at the detach; the evidence still holds
    assert AuditRecord.objects.filter(run=run, outcome="detached").count() == len(EXPIRED)
    assert verify_chain().ok
    assert check_run(run, shadow=("public", "rr_parts_shadow")) == []
    manifest = json.loads("".join(exports.manifest_json(run)))
    assert sorted(p["partition"] for p in manifest["partitions"] if p["dropped_at"]) == [
        f"public.{n}" for n in old
    ]
    # a second pass has nothing more to drop
    assert reconcile()["detached"] == []


def test_without_detached_keep_a_detached_table_is_kept_for_good(parts, make_user):
    policy = approved_policy(make_user, **parts_spec(partition_action="detach", keep=[]))
    run = drain(trigger_run(policy, tick=NOW)[0])
    _age(run, [f"rr_parts_{m}" for m in EXPIRED], 3650)
    assert reconcile()["detached"] == []
    assert all(relation_exists(f"rr_parts_{m}") for m in EXPIRED)


def test_a_detached_table_attached_again_or_dropped_by_someone_is_left_alone_with_a_note(
    parts, make_user
):
    run = _detach_run(make_user)
    jan, feb, mar = (f"rr_parts_{m}" for m in EXPIRED[:3])
    _age(run, [jan, feb, mar], 31)
    with connection.cursor() as cur:
        cur.execute(
            f"ALTER TABLE public.rr_parts ATTACH PARTITION public.{jan} "
            + PartitionAction.objects.get(run=run, name=jan).bounds
        )
        cur.execute(f"DROP TABLE public.{feb}")
        # a row slipped into March's table: not the rows its record names
        cur.execute(f"INSERT INTO public.{mar} VALUES (999999, 1, '2026-03-02', 'closed', '')")
    report = reconcile()
    notes = {
        a.name: a.note for a in PartitionAction.objects.filter(run=run, name__in=[jan, feb, mar])
    }
    assert "attached to rr_parts again: left alone" in notes[jan], notes
    assert "dropped outside the run: left alone" in notes[feb], notes
    assert "holds" in notes[mar] and "left alone, not dropped" in notes[mar], notes
    assert len(report["detached"]) == 3 and not any(
        r.endswith(": dropped") for r in report["detached"]
    )
    assert (
        attached(jan)
        and relation_exists(mar)
        and count(f"public.{mar}") == shadow_month(EXPIRED[2]) + 1
    )
    assert not PartitionAction.objects.filter(run=run, dropped_at__isnull=False).exists()
    assert OperatorAction.objects.filter(action="partition.leave_detached").count() == 3
    # a note is final: later passes leave them alone
    assert reconcile()["detached"] == []


def test_a_hold_placed_after_the_detach_keeps_the_detached_table(parts, make_user):
    run = _detach_run(make_user)
    jan = f"rr_parts_{EXPIRED[0]}"
    _age(run, [jan], 31)
    keeper = make_user("kim", "compliance")
    hold = retention_actions.place_hold(
        actor=keeper, reason="litigation", policy=run.policy, tenant="1"
    )
    held = count(f"public.{jan}", "tenant_id = 1")
    assert reconcile()["detached"] == [f"public.{jan}: kept, {held} row(s) may not go (held) now"]
    assert relation_exists(jan) and count(f"public.{jan}") == shadow_month(EXPIRED[0])
    release_hold(hold, requester=keeper, approver=make_user("kurt", "compliance"), reason="settled")
    assert reconcile()["detached"] == [f"public.{jan}: dropped"]
    assert not relation_exists(jan)
