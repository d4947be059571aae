"""``ON DELETE CASCADE`` under a policy: no row that a legal hold, a keep rule or the cutoff
protects goes through a cascade, and every row a chunk removes, in every table, is counted in its
audit record (``table_rows``). The real engine drains each table; the invariant checker judges
it against shadow copies of every table."""

from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from core import locks
from retention import actions as retention_actions
from retention.models import Policy
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence import exports
from runs.evidence.audit import TABLE_ROWS_CHAIN_VERSION, verify_chain
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, DeadLetter, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count
from tests.runs.processes import drain_past_an_open_write, pg_connect, wait_for
from tests.runs.test_decision_fence import advisory_waiters, in_thread
from tests.security.test_audit_append_only import behind_the_trigger

pytestmark = pytest.mark.django_db(transaction=True)

HELD_TENANT = 9


def sql(text: str, params=None) -> None:
    with connection.cursor() as cur:
        cur.execute(text, params)


def gone_by_table(run) -> dict[str, int]:
    """Rows each table lost, as the run's audit records count them."""
    totals: dict[str, int] = {}
    for record in AuditRecord.objects.filter(run=run):
        for name, rows in (record.table_rows or {record.table_name: record.rows_deleted}).items():
            totals[name] = totals.get(name, 0) + rows
    return totals


@pytest.fixture
def posts(transactional_db):
    """``public.rr_posts``: 2,000 originals over 40 days (tenant ``id % 10``), and reposts that
    reference an original, or another repost, ``ON DELETE CASCADE``: of expired originals,
    some held (tenant 9), some younger than the cutoff, some reposts of a young repost, and
    expired unheld ones that may go with their original."""
    sql("DROP TABLE IF EXISTS public.rr_posts, public.rr_posts_shadow")
    sql(
        "CREATE TABLE public.rr_posts (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " created_at timestamptz NOT NULL, status text NOT NULL DEFAULT 'shown',"
        " repost_of bigint REFERENCES public.rr_posts (id) ON DELETE CASCADE)"
    )
    sql(
        "INSERT INTO public.rr_posts (id, tenant_id, created_at)"
        " SELECT g, g %% 10, %s::timestamptz - make_interval(hours => 480 * 2 - g * 480 * 2 / 2000)"
        " FROM generate_series(1, 2000) AS g",
        [NOW],
    )
    # reposts (ids from 10001) of the expired originals 1..900 (older than 20 days: id < 1000)
    sql(
        "INSERT INTO public.rr_posts (id, tenant_id, created_at, repost_of)"
        " SELECT 10000 + g, CASE WHEN g %% 3 = 0 THEN 9 ELSE 1 END,"
        "  CASE WHEN g %% 4 = 0 THEN %s::timestamptz - interval '2 days'"
        "       ELSE %s::timestamptz - interval '30 days' END, g"
        " FROM generate_series(1, 900) AS g",
        [NOW, NOW],
    )
    # reposts of reposts: an expired, unheld repost (tenant 1, 30 days) with a young repost
    sql(
        "INSERT INTO public.rr_posts (id, tenant_id, created_at, repost_of)"
        " SELECT 20000 + id, 2, %s::timestamptz - interval '1 day', id FROM public.rr_posts"
        " WHERE id > 10000 AND id %% 5 = 0 AND tenant_id = 1 AND created_at < %s::timestamptz - interval '20 days'",
        [NOW, NOW],
    )
    sql("CREATE INDEX ON public.rr_posts (repost_of)")
    sql("CREATE INDEX ON public.rr_posts (tenant_id, id)")
    sql("CREATE TABLE public.rr_posts_shadow AS SELECT * FROM public.rr_posts")
    sql("ANALYZE public.rr_posts")
    yield
    sql("DROP TABLE IF EXISTS public.rr_posts, public.rr_posts_shadow")


def test_a_self_referencing_cascade_spares_held_and_young_reposts_and_the_audit_counts_every_row(
    posts, make_user
):
    policy = approved_policy(
        make_user, slug="posts", table="public.rr_posts", key="id", timestamp="created_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=200, chunking="key", cascade_ack=["public.rr_posts"],
    )  # fmt: skip
    keeper = make_user("keeper", "compliance")
    retention_actions.place_hold(
        actor=keeper, reason="case 17", policy=policy, tenant=str(HELD_TENANT)
    )
    cutoff = NOW.replace(day=10)  # tick − 20 days
    protected = "tenant_id = 9 OR created_at >= %s"
    held_or_young = count("public.rr_posts", protected, [cutoff])
    assert count("public.rr_posts", f"id > 10000 AND ({protected})", [cutoff]) > 300
    before = count("public.rr_posts")

    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)

    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_posts", protected, [cutoff]) == held_or_young  # none went
    gone = before - count("public.rr_posts")
    assert gone > 0
    assert gone_by_table(run) == {"public.rr_posts": gone}
    assert check_run(run, shadow=("public", "rr_posts_shadow")) == []
    # retention explain shows the chunk's DELETE with its guard, on the repost_of index
    out = StringIO()
    call_command("retention", "explain", "posts", stdout=out)
    delete = out.getvalue().split("== worker: chunk DELETE")[1].split("\n== ")[0]
    assert "Index Scan using rr_posts_repost_of_idx" in delete, delete
    assert "Index Cond: (repost_of = t.id)" in delete, delete


def create_orders() -> None:
    """``public.rr_orders`` (1,000 over 40 days) and ``public.rr_order_lines`` (three per
    order, ``ON DELETE CASCADE``), with shadow copies: see ``orders``."""
    drop_orders()
    sql(
        "CREATE TABLE public.rr_orders (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " placed_at timestamptz NOT NULL)"
    )
    sql(
        "INSERT INTO public.rr_orders SELECT g, g %% 10,"
        " %s::timestamptz - make_interval(hours => 960 - g * 960 / 1000)"
        " FROM generate_series(1, 1000) AS g",
        [NOW],
    )
    sql(
        "CREATE TABLE public.rr_order_lines (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " order_id bigint NOT NULL REFERENCES public.rr_orders (id) ON DELETE CASCADE,"
        " updated_at timestamptz NOT NULL, status text NOT NULL)"
    )
    # the even orders have three lines, as old as their order, except: line 2 of every fourth
    # order touched 5 days ago (younger than the lines' cutoff), line 3 of every sixth order of
    # tenant 9 (held), line 1 of every fourteenth order 'disputed' (kept)
    sql(
        "INSERT INTO public.rr_order_lines SELECT o.id * 10 + n,"
        " CASE WHEN n = 3 AND o.id %% 3 = 0 THEN 9 ELSE o.tenant_id END, o.id,"
        " CASE WHEN n = 2 AND o.id %% 4 = 0 THEN %s::timestamptz - interval '5 days'"
        "  ELSE o.placed_at END,"
        " CASE WHEN n = 1 AND o.id %% 7 = 0 THEN 'disputed' ELSE 'closed' END"
        " FROM public.rr_orders o, generate_series(1, 3) AS n WHERE o.id %% 2 = 0",
        [NOW],
    )
    sql("CREATE INDEX ON public.rr_order_lines (order_id)")
    sql("CREATE INDEX ON public.rr_order_lines (tenant_id, id)")
    sql("CREATE TABLE public.rr_orders_shadow AS SELECT * FROM public.rr_orders")
    sql("CREATE TABLE public.rr_order_lines_shadow AS SELECT * FROM public.rr_order_lines")
    sql("ANALYZE public.rr_orders")
    sql("ANALYZE public.rr_order_lines")


def drop_orders() -> None:
    sql(
        "DROP TABLE IF EXISTS public.rr_order_lines, public.rr_orders,"
        " public.rr_order_lines_shadow, public.rr_orders_shadow"
    )


@pytest.fixture
def orders(transactional_db):
    """``public.rr_orders`` (1,000 over 40 days) and ``public.rr_order_lines`` (three per
    order, ``ON DELETE CASCADE``), the lines the target of a policy of their own: 10 days'
    retention on their own timestamp, a hold on tenant 9, and lines marked 'disputed' kept."""
    create_orders()
    yield
    drop_orders()


def test_a_cascade_into_another_policys_table_respects_its_holds_keep_rules_and_cutoff(
    orders, make_user, client
):
    lines = approved_policy(
        make_user, slug="lines", table="public.rr_order_lines", key="id",
        timestamp="updated_at", tenant="tenant_id", retention="10 days", schedule="0 4 * * *",
        timezone="UTC", keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )  # fmt: skip
    keeper = make_user("keeper", "compliance")
    retention_actions.place_hold(
        actor=keeper, reason="case 18", policy=lines, tenant=str(HELD_TENANT)
    )
    orders_policy = approved_policy(
        make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=100, chunking="key", cascade_ack=["public.rr_order_lines"],
    )  # fmt: skip
    lines_cutoff = NOW.replace(day=20)
    protected = "tenant_id = 9 OR status = 'disputed' OR updated_at >= %s"
    protected_lines = count("public.rr_order_lines", protected, [lines_cutoff])
    assert protected_lines > 300
    lines_before, orders_before = count("public.rr_order_lines"), count("public.rr_orders")

    run, _ = trigger_run(orders_policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)

    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_order_lines", protected, [lines_cutoff]) == protected_lines
    lines_gone = lines_before - count("public.rr_order_lines")
    orders_gone = orders_before - count("public.rr_orders")
    # the odd orders have no lines and go; an even one only when none of its lines is protected
    assert lines_gone > 0 and orders_gone > 0
    assert count("public.rr_orders", "id %% 2 = 1 AND placed_at < %s", [NOW.replace(day=10)]) == 0
    assert gone_by_table(run) == {
        "public.rr_orders": orders_gone,
        "public.rr_order_lines": lines_gone,
    }
    cascaded = {"public.rr_order_lines": ("public", "rr_order_lines_shadow")}
    assert check_run(run, shadow=("public", "rr_orders_shadow"), cascaded=cascaded) == []

    # the evidence: every record hashes its rows per table; the CSV, the manifest and the run
    # page show them
    records = list(AuditRecord.objects.filter(run=run))
    assert {r.chain_version for r in records} == {TABLE_ROWS_CHAIN_VERSION}
    assert verify_chain().ok
    text = b"".join(exports.csv_rows(exports.AuditFilters(run=str(run.pk)))).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert sum(json.loads(r["table_rows"])["public.rr_order_lines"] for r in rows) == lines_gone
    manifest = json.loads("".join(exports.manifest_json(run)))
    assert manifest["totals"]["rows_removed_by_table"] == gone_by_table(run)
    assert sum(c["table_rows"]["public.rr_orders"] for c in manifest["chunks"]) == orders_gone
    client.force_login(make_user("olga", "oncall"))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"<code>public.rr_order_lines</code> {lines_gone:,}" in page
    # a record whose cascade count is edited no longer verifies
    edited = records[0]
    behind_the_trigger(
        "UPDATE runs_auditrecord SET table_rows = %s::jsonb WHERE id = %s",
        [json.dumps({**edited.table_rows, "public.rr_order_lines": 0}), edited.pk],
    )
    assert not verify_chain().ok


def test_a_cascade_into_a_table_whose_policy_overrides_tenants_judges_each_line_by_its_tenant(
    orders, make_user
):
    """The lines' policy keeps 10 days, tenant 4 forever and tenant 6 for 25 days, and its
    class 'disputed' for 35 days: an order goes only when each of its lines would go by the
    period of that line's own tenant and class, not by the lines' default."""
    approved_policy(
        make_user, slug="lines", table="public.rr_order_lines", key="id",
        timestamp="updated_at", tenant="tenant_id", retention="10 days", schedule="0 4 * * *",
        timezone="UTC",
        override=[{"tenant": 4, "retention": "forever"}, {"tenant": 6, "retention": "25 days"}],
        **{"class": [{"column": "status", "value": "disputed", "retention": "35 days"}]},
    )  # fmt: skip
    orders_policy = approved_policy(
        make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=100, chunking="key", cascade_ack=["public.rr_order_lines"],
    )  # fmt: skip
    protected = (
        "tenant_id = 4 OR updated_at >= %s OR (tenant_id = 6 AND updated_at >= %s)"
        " OR (status = 'disputed' AND updated_at >= %s)"
    )
    cutoffs = [NOW - timedelta(days=10), NOW - timedelta(days=25), NOW - timedelta(days=35)]
    protected_lines = count("public.rr_order_lines", protected, cutoffs)
    # lines of tenant 6 between 25 and 10 days old, which the default alone would let go
    assert (
        count(
            "public.rr_order_lines",
            "tenant_id = 6 AND updated_at < %s AND updated_at >= %s",
            cutoffs[:2],
        )
        > 10
    )
    lines_before = count("public.rr_order_lines")

    run, _ = trigger_run(orders_policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)

    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_order_lines", protected, cutoffs) == protected_lines
    assert count("public.rr_order_lines", "tenant_id = 4") == count(
        "public.rr_order_lines_shadow", "tenant_id = 4"
    )
    assert lines_before - count("public.rr_order_lines") > 0  # other tenants' lines went
    cascaded = {"public.rr_order_lines": ("public", "rr_order_lines_shadow")}
    assert check_run(run, shadow=("public", "rr_orders_shadow"), cascaded=cascaded) == []


def test_the_checker_reports_protected_rows_a_cascade_removed_and_rows_it_did_not_audit(
    orders, make_user
):
    approved_policy(
        make_user, slug="lines", table="public.rr_order_lines", key="id",
        timestamp="updated_at", retention="10 days", schedule="0 4 * * *", timezone="UTC",
    )  # fmt: skip
    orders_policy = approved_policy(
        make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
        retention="20 days", schedule="0 3 * * *", timezone="UTC",
        cascade_ack=["public.rr_order_lines"],
    )  # fmt: skip
    run, _ = trigger_run(orders_policy, tick=NOW)
    sql("DELETE FROM public.rr_orders WHERE id = 4")  # its line 2 is 5 days old

    problems = check_run(
        run,
        shadow=("public", "rr_orders_shadow"),
        cascaded={"public.rr_order_lines": ("public", "rr_order_lines_shadow")},
        expect_drained=False,
    )

    assert problems == [
        "1 row(s) gone but 0 audited",
        "public.rr_order_lines: 3 row(s) gone but 0 audited",
        "public.rr_order_lines: 1 row(s) that policy lines protects (newer than its cutoff, "
        "kept or held) are gone",
    ]


def test_a_cascade_cycle_created_after_approval_dead_letters_the_chunks_and_deletes_nothing(
    orders, make_user
):
    policy = approved_policy(
        make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
        retention="20 days", schedule="0 3 * * *", timezone="UTC", chunk_size=500,
        chunking="key", cascade_ack=["public.rr_order_lines"],
    )  # fmt: skip
    sql(
        "ALTER TABLE public.rr_orders ADD COLUMN line_id bigint"
        " REFERENCES public.rr_order_lines (id) ON DELETE CASCADE"
    )
    before = count("public.rr_orders"), count("public.rr_order_lines")
    run, _ = trigger_run(policy, tick=NOW)

    worker.drain(run.pk, budget_s=30, until_idle=True)

    assert (count("public.rr_orders"), count("public.rr_order_lines")) == before
    run.refresh_from_db()
    assert run.state == Run.State.ATTENTION, run.state_reason
    letters = list(DeadLetter.objects.filter(run=run))
    assert letters and all(x.error_class == "permanent" for x in letters)
    assert all("rr_orders_line_id_fkey on public.rr_orders (line_id)" in x.message for x in letters)


def test_approving_a_version_of_a_table_that_cascades_reach_waits_for_every_chunk_in_flight(
    orders, make_user
):
    """Another policy's chunk judges this table's rows by its approved version: the approval is
    ordered against every chunk in flight (each holds the global fence shared until it
    commits), as a legal hold is. A table no cascade reaches keeps its policy's own fence."""
    spec = dict(
        slug="lines", table="public.rr_order_lines", key="id", timestamp="updated_at",
        retention="10 days", schedule="0 4 * * *", timezone="UTC",
    )  # fmt: skip
    approved_policy(make_user, **spec)
    chunk_in_flight = pg_connect(autocommit=False)
    chunk_in_flight.execute("SELECT pg_advisory_xact_lock_shared(%s, 0)", [locks.HOLDS])
    observer = pg_connect()
    try:
        # a table no cascade reaches: approved at once
        approved_policy(
            make_user, slug="orders", table="public.rr_orders", key="id",
            timestamp="placed_at", retention="20 days", schedule="0 3 * * *",
            cascade_ack=["public.rr_order_lines"],
        )  # fmt: skip
        with ThreadPoolExecutor(max_workers=1) as pool:
            approval = pool.submit(
                in_thread(lambda: approved_policy(make_user, **{**spec, "retention": "5 days"}))
            )
            wait_for(lambda: advisory_waiters(observer), what="the approval to wait")
            assert not approval.done()
            chunk_in_flight.commit()
            approval.result(timeout=60)
    finally:
        chunk_in_flight.close()
        observer.close()
    lines = Policy.objects.get(slug="lines")
    assert lines.approved_version.parsed.retention == "5 days"


def test_a_repost_committed_while_a_chunk_deletes_its_original_is_not_cascaded_away(
    posts, make_user
):
    """A young repost of an expired original, inserted by the application while the chunk that
    deletes the original runs (its insert holds the original's key-share lock until it commits),
    stays, and so does its original: the chunk locks its rows before it judges their cascades,
    so what it judges includes every reference committed before it could delete."""
    policy = approved_policy(
        make_user, slug="posts", table="public.rr_posts", key="id", timestamp="created_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=5000, chunking="key", cascade_ack=["public.rr_posts"],
    )  # fmt: skip
    assert count("public.rr_posts", "repost_of = 950") == 0  # an expired original, no repost
    run, _ = trigger_run(policy, tick=NOW)
    application = pg_connect(autocommit=False)
    try:
        application.execute(
            "INSERT INTO public.rr_posts (id, tenant_id, created_at, repost_of)"
            " VALUES (99999, 1, %s, 950)",
            [NOW],
        )
        drain_past_an_open_write(application, run.pk)
    finally:
        application.close()
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_posts", "id IN (950, 99999)") == 2
    gone = count("public.rr_posts_shadow") + 1 - count("public.rr_posts")
    assert gone_by_table(run) == {"public.rr_posts": gone}


@pytest.mark.parametrize(
    "change",
    ["status = 'disputed'", "updated_at = %s::timestamptz - interval '1 day'"],
    ids=["disputed", "young"],
)
def test_a_line_made_protected_while_a_chunk_deletes_its_order_stays_with_its_order(
    orders, make_user, no_guard, change
):
    """The application marks a line 'disputed' (kept by the lines' own policy), or touches it
    (younger than the lines' cutoff), in a transaction that is still open when the chunk
    deleting its order judges the order's cascade; it commits while the chunk waits. The chunk
    locks every row its cascade will reach before it judges them, so it waits for that update
    and judges the line on its committed values: the line stays, and so does its order; the
    audit and the checker agree."""
    params = [NOW] if "%s" in change else []
    approved_policy(
        make_user, slug="lines", table="public.rr_order_lines", key="id",
        timestamp="updated_at", tenant="tenant_id", retention="10 days", schedule="0 4 * * *",
        timezone="UTC", keep=[{"column": "status", "op": "=", "value": "disputed"}],
    )  # fmt: skip
    orders_policy = approved_policy(
        make_user, slug="orders", table="public.rr_orders", key="id", timestamp="placed_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=100, chunking="key", cascade_ack=["public.rr_order_lines"],
    )  # fmt: skip
    # order 2 is expired and every line of it may go: without the update, it goes with them
    assert count("public.rr_order_lines", "order_id = 2 AND status = 'closed'") == 3
    run, _ = trigger_run(orders_policy, tick=NOW)
    application = pg_connect(autocommit=False)
    try:
        application.execute(f"UPDATE public.rr_order_lines SET {change} WHERE id = 21", params)
        drain_past_an_open_write(application, run.pk)
    finally:
        application.close()
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert count("public.rr_order_lines", f"id = 21 AND {change}", params) == 1
    assert count("public.rr_orders", "id = 2") == 1
    orders_gone = count("public.rr_orders_shadow") - count("public.rr_orders")
    lines_gone = count("public.rr_order_lines_shadow") - count("public.rr_order_lines")
    assert orders_gone > 0 and lines_gone > 0
    assert gone_by_table(run) == {
        "public.rr_orders": orders_gone,
        "public.rr_order_lines": lines_gone,
    }
    # the checker judges the lines by their values now (the shadow still has the old ones)
    sql(f"UPDATE public.rr_order_lines_shadow SET {change} WHERE id = 21", params)
    cascaded = {"public.rr_order_lines": ("public", "rr_order_lines_shadow")}
    assert check_run(run, shadow=("public", "rr_orders_shadow"), cascaded=cascaded) == []
