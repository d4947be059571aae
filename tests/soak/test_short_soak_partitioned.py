"""The chaos soak in its short mode on a range-partitioned table (bench/soak.py
``--partitioned``): under the same faults as tests/soak/test_short_soak.py, each run's first
pass drops the younger half's day partitions whole; the run must converge and every
invariant must hold."""

from __future__ import annotations

import pytest

from tests.soak.short_soak import on_its_own_server, short_soak

pytestmark = pytest.mark.processes


@on_its_own_server
def test_a_partitioned_table_under_chaos_drops_whole_partitions_and_every_invariant_holds(
    tmp_path,
):
    # a mid-soak invariant check every 4 faults (not 15): a 60 s fault phase on a busy machine
    # injects fewer faults, and the test asks for a check before the final one
    report = short_soak(
        tmp_path, "--seconds", "60", "--converge-seconds", "60", "--check-every", "4",
        "--partitioned",
    )  # fmt: skip
    assert report["partitions_dropped"] > 0
    [epoch] = report["epochs"]
    assert epoch["converged"] and "drained" in epoch["runs"].values()
    assert report["invariant_checks_passed"] >= 2
