"""The chaos soak in its short mode (bench/soak.py): real cleanup clusters and drain processes
drain a run while a driver kills workers, terminates their backends, locks the table, places
and releases holds, supersedes the policy, fires duplicate triggers, pauses, flips the kill
switch and restarts PostgreSQL. The run must converge and every invariant must hold — on a
plain table, and on a range-partitioned one whose first pass drops partitions whole.

Both soaks share one embedded PostgreSQL server of their own (tests/soak/short_soak.py), so
restarting it never touches the database other tests use, and the second one clones the
first one's migrated database instead of migrating again."""

from __future__ import annotations

import pytest

from tests.soak.short_soak import on_its_own_server, short_soak, soak_pgdata

__all__ = ["soak_pgdata"]

pytestmark = pytest.mark.processes

FAULT_PHASE_S = 30  # at least; then on until each fault below happened (at most 90 s)
# the faults this test asks about: the phase lasts until each was injected and a mid-soak
# invariant check passed, rather than a fixed 90 s that a busy machine may still not fill
COVERED = ("pg_restart", "sigkill_qcluster", "terminate_backend", "lock_table", "legal_hold")


@on_its_own_server
def test_a_run_under_chaos_converges_and_every_invariant_holds(tmp_path, soak_pgdata):
    report = short_soak(
        tmp_path, soak_pgdata, "--seconds", str(FAULT_PHASE_S),
        "--until-covered", ",".join(COVERED), "--converge-seconds", "60",
    )  # fmt: skip
    [epoch] = report["epochs"]
    assert epoch["converged"]
    assert "drained" in epoch["runs"].values()
    assert report["rows_deleted"] > 0
    assert report["invariant_checks_passed"] >= 2
    injected = {row["fault"]: row["injected"] for row in report["faults"]}
    assert injected["pg_restart"] == 1
    for kind in COVERED:
        assert injected[kind] > 0, kind
    assert report["survived"] == report["injected"], report["table"]
    assert report["stuck_messages"] == 0 and report["idle_in_transaction"] == 0


@on_its_own_server
def test_a_partitioned_table_under_chaos_drops_whole_partitions_and_every_invariant_holds(
    tmp_path, soak_pgdata
):
    # the partitions go whole in each run's first pass, at the start: a 20 s fault phase that
    # goes on (at most 60 s) until the same faults happened and a mid-soak check (every 4
    # faults) passed, rather than a fixed 60 s
    report = short_soak(
        tmp_path, soak_pgdata, "--seconds", "20", "--until-covered", ",".join(COVERED),
        "--converge-seconds", "60", "--check-every", "4", "--partitioned",
    )  # fmt: skip
    assert report["partitions_dropped"] > 0
    [epoch] = report["epochs"]
    assert epoch["converged"] and "drained" in epoch["runs"].values()
    assert report["invariant_checks_passed"] >= 2
    assert report["survived"] == report["injected"], report["table"]
