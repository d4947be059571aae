"""The demo marketplace generator (demo/marketplace.py) on a small size."""

from __future__ import annotations

import pytest
from django.db import connection

from demo.marketplace import (
    TABLES,
    DemoDataError,
    DemoParams,
    current_counts,
    ensure_marketplace,
    stored_meta,
)

from .conftest import SMALL, checksum, scalar


def test_it_writes_the_requested_row_counts(marketplace):
    counts = current_counts()
    assert counts["tenants"] == 50
    assert counts["marketplace_events"] == 20_000
    assert counts["orders"] == 2_000
    assert counts["renewal_reminders"] == 1_000
    assert 0.07 * 20_000 <= counts["delivery_attempts"] <= 0.13 * 20_000
    assert stored_meta()["counts"] == counts
    assert marketplace.counts == counts


def test_one_tenant_owns_about_forty_percent_and_the_rest_fall_off(marketplace):
    shares = [
        row[1]
        for row in _rows(
            "SELECT tenant_id, count(*)::float8 / sum(count(*)) OVER ()"
            " FROM marketplace.marketplace_events GROUP BY tenant_id ORDER BY 2 DESC"
        )
    ]
    assert len(shares) == 50
    assert 0.35 <= shares[0] <= 0.45
    # Zipf-like: the next tenants shrink, the tail is small but present.
    assert shares[1] > shares[4] > shares[19] > shares[-1] > 0
    assert 0.10 <= shares[1] <= 0.17
    big = scalar(
        "SELECT tenant_id FROM marketplace.marketplace_events"
        " GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
    )
    assert big == 1
    for table in ("orders", "renewal_reminders", "delivery_attempts"):
        share = scalar(
            f"SELECT avg((tenant_id = 1)::int)::float8 FROM marketplace.{table}"  # noqa: S608
        )
        assert 0.33 <= share <= 0.47, table


def test_about_half_of_the_events_are_older_than_ninety_days(marketplace):
    ref = marketplace.reference_at
    old = scalar(
        "SELECT avg((occurred_at < %s - interval '90 days')::int)::float8"
        " FROM marketplace.marketplace_events",
        [ref],
    )
    assert 0.45 <= old <= 0.55
    span = _rows(
        "SELECT min(occurred_at) >= %s::timestamptz - interval '180 days 1 hour',"
        " max(occurred_at) <= %s::timestamptz FROM marketplace.marketplace_events",
        [ref, ref],
    )[0]
    assert span == (True, True)


def test_event_ids_increase_with_time_up_to_a_small_jitter(marketplace):
    correlation = scalar(
        "SELECT corr(id, extract(epoch FROM occurred_at)) FROM marketplace.marketplace_events"
    )
    assert correlation > 0.999
    # No event is more than the jitter (20 minutes) earlier than the one before it.
    backwards = scalar(
        "SELECT count(*) FROM (SELECT occurred_at - lag(occurred_at) OVER (ORDER BY id) AS d"
        " FROM marketplace.marketplace_events) AS s WHERE d < -interval '20 minutes'"
    )
    assert backwards == 0
    attempts = scalar(
        "SELECT corr(id, extract(epoch FROM attempted_at)) FROM marketplace.delivery_attempts"
    )
    assert attempts > 0.99


def test_pending_reminders_exist_old_and_new(marketplace):
    ref = marketplace.reference_at
    old_pending = scalar(
        "SELECT count(*) FROM marketplace.renewal_reminders"
        " WHERE state = 'pending' AND created_at < %s - interval '60 days'",
        [ref],
    )
    not_yet_due = scalar(
        "SELECT count(*) FROM marketplace.renewal_reminders WHERE state = 'pending'"
        " AND due_at > %s",
        [ref],
    )
    assert old_pending >= 10
    assert not_yet_due >= 10
    assert scalar("SELECT count(*) FROM marketplace.renewal_reminders WHERE state = 'sent'") > 0


def test_delivery_attempts_follow_their_reminders(marketplace):
    assert (
        scalar(
            "SELECT count(*) FROM marketplace.delivery_attempts"
            " WHERE replay_until <> attempted_at + interval '14 days'"
        )
        == 0
    )
    assert scalar("SELECT count(DISTINCT dedup_key) = count(*) FROM marketplace.delivery_attempts")
    # Every sent reminder has its delivered attempt, at the time it was sent.
    undelivered = scalar(
        "SELECT count(*) FROM marketplace.renewal_reminders AS r WHERE r.state = 'sent'"
        " AND NOT EXISTS (SELECT 1 FROM marketplace.delivery_attempts AS a"
        " WHERE a.reminder_id = r.id AND a.outcome = 'delivered' AND a.attempted_at = r.sent_at)"
    )
    assert undelivered == 0
    # Attempts still awaiting an outcome exist long after their replay window closed.
    assert (
        scalar(
            "SELECT count(*) FROM marketplace.delivery_attempts"
            " WHERE outcome = 'pending' AND replay_until < %s - interval '30 days'",
            [marketplace.reference_at],
        )
        > 0
    )


def test_old_orders_include_ones_under_dispute_or_open_refund(marketplace):
    ref = marketplace.reference_at
    rows = dict(
        _rows(
            "SELECT CASE WHEN status IN ('disputed', 'chargeback') THEN 'dispute'"
            " WHEN refund_state = 'open' THEN 'open refund' ELSE 'settled' END, count(*)"
            " FROM marketplace.orders WHERE created_at < %s - interval '365 days' GROUP BY 1",
            [ref],
        )
    )
    assert rows["dispute"] > 0
    assert rows["open refund"] > 0
    assert rows["settled"] > 0.8 * sum(rows.values())


def test_it_leaves_the_tables_indexed_vacuumed_and_analyzed(marketplace):
    indexes = {
        row[0] for row in _rows("SELECT indexdef FROM pg_indexes WHERE schemaname = 'marketplace'")
    }
    for expected in (
        "marketplace_events USING btree (tenant_id, id)",
        "marketplace_events USING btree (occurred_at)",
        "orders USING btree (tenant_id, id)",
        "orders USING btree (created_at)",
        "delivery_attempts USING btree (tenant_id, id)",
        "delivery_attempts USING btree (replay_until)",
        "UNIQUE INDEX delivery_attempts_dedup_key_key",
    ):
        assert any(expected in index for index in indexes), expected
    never_analyzed = scalar(
        "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'marketplace'"
        " AND relname <> 'demo_meta' AND (last_analyze IS NULL OR last_vacuum IS NULL)"
    )
    assert never_analyzed == 0


def test_a_second_call_with_the_same_parameters_changes_nothing(marketplace):
    before = {table: checksum(table) for table in TABLES}
    again = ensure_marketplace(SMALL)
    assert again.skipped
    assert again.reference_at == marketplace.reference_at
    assert again.counts == marketplace.counts
    assert {table: checksum(table) for table in TABLES} == before


def test_the_same_seed_gives_the_same_rows(marketplace):
    stable = "t.id, t.tenant_id, t.kind, t.payload"
    first = checksum("marketplace_events", stable)
    other = ensure_marketplace(DemoParams(rows=SMALL.rows, seed=7, tenants=SMALL.tenants))
    assert not other.skipped
    assert checksum("marketplace_events", stable) != first
    back = ensure_marketplace(SMALL)
    assert not back.skipped
    assert checksum("marketplace_events", stable) == first


def test_a_table_that_lost_rows_is_regenerated(marketplace):
    with connection.cursor() as cur:
        cur.execute("DELETE FROM marketplace.marketplace_events WHERE id <= 1000")
    result = ensure_marketplace(SMALL)
    assert not result.skipped
    assert current_counts()["marketplace_events"] == 20_000


def test_it_refuses_to_drop_a_marketplace_schema_it_did_not_create(transactional_db):
    with connection.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS marketplace CASCADE")
        cur.execute("CREATE SCHEMA marketplace")
        cur.execute("CREATE TABLE marketplace.ledger (id int)")
        cur.execute("INSERT INTO marketplace.ledger VALUES (1)")
    with pytest.raises(DemoDataError, match="not created by the demo"):
        ensure_marketplace(SMALL)
    assert scalar("SELECT count(*) FROM marketplace.ledger") == 1
    with connection.cursor() as cur:
        cur.execute("DROP SCHEMA marketplace CASCADE")


def test_it_loads_inside_a_callers_transaction(db):
    result = ensure_marketplace(DemoParams(rows=5_000, seed=3, tenants=10))
    assert result.counts["marketplace_events"] == 5_000
    assert result.counts["tenants"] == 10
    # analyzed in the same transaction, so the planner knows the table's size
    assert scalar("SELECT reltuples FROM pg_class WHERE oid = 'marketplace.orders'::regclass") > 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rows": 999}, "rows must be at least 1000"),
        ({"rows": 10_000, "tenants": 1}, "tenants must be between"),
        ({"rows": 10_000, "seed": -1}, "seed must be between"),
    ],
)
def test_it_rejects_parameters_it_cannot_honour(params, message):
    with pytest.raises(DemoDataError, match=message):
        DemoParams(**params)


def _rows(query: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()
