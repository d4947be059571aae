"""Legal holds and keep rules are evaluated inside the DELETE, ordered by the hold fence.

These tests use real second (and third) PostgreSQL connections: the deleting
transaction is not a mock, and the waits are PostgreSQL lock waits.
"""

from __future__ import annotations

import io
import threading
import time
from datetime import datetime

import psycopg
import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from core.locks import HOLDS
from core.models import OperatorAction
from retention import actions, predicate
from retention.actions import ActionError
from retention.models import LegalHold
from retention.preview import preview
from retention.spec import load_toml
from tests.conftest import token_for_claim

from .conftest import count_rows, policy_toml, second_dsn


def applied(author, **overrides):
    spec = load_toml(policy_toml(**overrides))
    version = actions.apply_spec(spec, author=author)
    return spec, version.policy


def cutoff_now(spec, policy) -> datetime:
    return datetime.fromisoformat(preview(spec, policy_id=policy.pk)["cutoff"])


def chunk_delete(conn, spec, policy, cutoff, *, tenant, key_from, key_to) -> int:
    """A worker's chunk statement on ``conn``: the fence shared, then the DELETE."""
    conn.execute("SELECT pg_advisory_xact_lock_shared(%s, 0)", [HOLDS])
    frag = predicate.delete_chunk(
        spec, policy_id=policy.pk, cutoff=cutoff, tenant=tenant, key_from=key_from, key_to=key_to
    )
    return conn.execute(frag.sql, frag.params).rowcount


def wait_until_blocked(conn, pid: int, timeout: float = 10.0) -> None:
    """Return once backend ``pid`` waits for a lock (as PostgreSQL sees it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        conn.commit()
        if row and row[0] == "Lock":
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for a lock")


def in_thread(target):
    """Run ``target`` in a thread; return (thread, outcome dict)."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = target()
        except BaseException as exc:  # reported to the test thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_placing_a_hold_waits_for_the_deletion_in_flight_and_binds_every_later_one(
    events_table, alice, second_connection
):
    spec, policy = applied(alice)
    cutoff = cutoff_now(spec, policy)
    tenant_old = "tenant_id = 3 AND occurred_at < %s"
    low_before = count_rows(f"{tenant_old} AND id < 1000", [cutoff])
    high_before = count_rows(f"{tenant_old} AND id >= 1000", [cutoff])
    assert low_before > 0 and high_before > 0

    worker = second_connection
    deleted = chunk_delete(worker, spec, policy, cutoff, tenant="3", key_from=0, key_to=1000)
    assert deleted == low_before  # in flight, not committed

    hold_thread, outcome = in_thread(
        lambda: actions.place_hold(actor=alice, reason="litigation", policy=policy, tenant="3")
    )
    with psycopg.connect(second_dsn()) as observer:
        holder_pid = None
        deadline = time.monotonic() + 10
        while holder_pid is None and time.monotonic() < deadline:
            row = observer.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
                " AND NOT granted",
                [HOLDS],
            ).fetchone()
            observer.commit()
            holder_pid = row[0] if row else None
            time.sleep(0.02)
        assert holder_pid is not None, "place_hold did not wait for the fence"
        time.sleep(0.2)
        assert hold_thread.is_alive()
        assert LegalHold.objects.count() == 0

        worker.commit()  # the chunk in flight commits before the hold
        hold_thread.join(10)
    assert not hold_thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    hold = outcome["value"]
    assert hold.active

    assert count_rows(f"{tenant_old} AND id < 1000", [cutoff]) == 0
    later = chunk_delete(worker, spec, policy, cutoff, tenant="3", key_from=1000, key_to=10**9)
    worker.commit()
    assert later == 0
    assert count_rows(f"{tenant_old} AND id >= 1000", [cutoff]) == high_before


def test_a_delete_started_after_the_hold_committed_never_deletes_held_rows(
    events_table, alice, second_connection
):
    spec, policy = applied(alice)
    cutoff = cutoff_now(spec, policy)
    actions.place_hold(actor=alice, reason="audit", tenant="2", key_from=500, key_to=1500)
    held_rows = count_rows(
        "tenant_id = 2 AND id >= 500 AND id < 1500 AND occurred_at < %s", [cutoff]
    )
    assert held_rows > 0

    for tenant in ("1", "2", "3", "4", "5"):
        chunk_delete(
            second_connection, spec, policy, cutoff, tenant=tenant, key_from=0, key_to=10**9
        )
    second_connection.commit()

    assert count_rows("occurred_at < %s", [cutoff]) == held_rows
    assert (
        count_rows("tenant_id = 2 AND id >= 500 AND id < 1500 AND occurred_at < %s", [cutoff])
        == held_rows
    )


def test_a_row_that_becomes_kept_while_the_delete_waits_for_it_survives(
    events_table, alice, second_connection
):
    spec, policy = applied(alice, tables='[[keep]]\ncolumn = "status"\nop = "="\nvalue = "legal"\n')
    cutoff = cutoff_now(spec, policy)
    rescued = count_rows("tenant_id = 4 AND status = 'open' AND occurred_at < %s", [cutoff])
    legal = count_rows("tenant_id = 4 AND status = 'legal' AND occurred_at < %s", [cutoff])
    assert rescued > 0

    editor = second_connection
    editor.execute(
        "UPDATE public.t_events SET status = 'legal' WHERE tenant_id = 4 AND status = 'open'"
    )

    with psycopg.connect(second_dsn()) as worker, psycopg.connect(second_dsn()) as observer:
        worker_pid = worker.info.backend_pid
        thread, outcome = in_thread(
            lambda: chunk_delete(worker, spec, policy, cutoff, tenant="4", key_from=0, key_to=10**9)
        )
        wait_until_blocked(observer, worker_pid)
        editor.commit()
        thread.join(10)
        assert "error" not in outcome, outcome.get("error")
        worker.commit()

    assert count_rows("tenant_id = 4 AND status = 'legal' AND occurred_at < %s", [cutoff]) == (
        legal + rescued
    )
    assert count_rows("tenant_id = 4 AND status = 'closed' AND occurred_at < %s", [cutoff]) == 0


def test_releasing_a_hold_makes_its_rows_eligible_again(events_table, alice, bob):
    spec, policy = applied(alice)
    hold = actions.place_hold(actor=alice, reason="audit", policy=policy)
    assert preview(spec, policy_id=policy.pk)["eligible"] == 0

    actions.request_hold_release(hold, actor=alice, reason="case closed")
    assert preview(spec, policy_id=policy.pk)["eligible"] == 0  # requested: still in force
    actions.approve_hold_release(hold, actor=bob, reason="confirmed")

    hold.refresh_from_db()
    assert (hold.release_requested_by, hold.released_by) == ("alice", "bob")
    assert preview(spec, policy_id=policy.pk)["eligible"] > 0
    with pytest.raises(ActionError, match="already released"):
        actions.request_hold_release(hold, actor=alice, reason="again")


def test_only_compliance_places_holds_and_every_hold_has_a_reason(events_table, alice, olga):
    with pytest.raises(PermissionDenied):
        actions.place_hold(actor=olga, reason="mine")
    with pytest.raises(ActionError, match="needs a reason"):
        actions.place_hold(actor=alice, reason=" ")
    with pytest.raises(ActionError, match="is empty"):
        actions.place_hold(actor=alice, reason="x", key_from=10, key_to=10)
    assert LegalHold.objects.count() == 0


def test_the_hold_commands_place_list_and_release(events_table, alice, bob):
    applied(alice)

    def cli(*args):
        token_for_claim(args)
        out = io.StringIO()
        call_command("retention", "hold", *args, stdout=out)
        return out.getvalue().strip()

    placed = cli(
        "place", "--reason", "subpoena 7", "--by", "alice", "--policy", "events",
        "--tenant", "3", "--key-from", "10", "--key-to", "20",
    )  # fmt: skip
    hold = LegalHold.objects.get()
    assert placed == (
        f"hold #{hold.pk} placed: policy events, tenant 3, keys [10, 20)\n"
        "  events: tenant 3 (integer), keys [10, 20) — 2 rows now"
    )
    assert f"#{hold.pk}  policy events, tenant 3, keys [10, 20)  active" in cli("list")

    assert cli("release", str(hold.pk), "--by", "alice", "--reason", "settled").startswith(
        f"hold #{hold.pk}: release requested by alice; it stays in force"
    )
    assert "release requested by alice" in cli("list")
    assert cli("approve-release", str(hold.pk), "--by", "bob", "--reason", "confirmed").startswith(
        f"hold #{hold.pk} released by bob (requested by alice)"
    )
    assert cli("list") == "no holds"
    assert list(
        OperatorAction.objects.filter(target_type="legalhold").values_list("action", "reason")
    ) == [("hold.release", "confirmed"), ("hold.release_request", "settled"),
          ("hold.place", "subpoena 7")]  # fmt: skip

    with pytest.raises(CommandError, match="unknown policy 'nope'"):
        cli("place", "--reason", "x", "--by", "alice", "--policy", "nope")
    with pytest.raises(CommandError, match="set RETENTION_TOKEN"):
        cli("release", str(hold.pk), "--by", "eve", "--reason", "x")
    assert LegalHold.objects.count() == 1
