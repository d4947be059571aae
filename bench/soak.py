"""Chaos soak: real workers drain real runs while a driver injects faults; at the end every run
must converge and the invariant checker must pass against a shadow copy of the table.

    .venv/bin/python bench/soak.py --seconds 100         # short mode (CI: tests/soak/test_short_soak.py)
    .venv/bin/python bench/soak.py --minutes 30          # long mode: epochs until the time is up

The soak runs on its OWN embedded PostgreSQL server (``--pgdata``, default a new directory
under /tmp; ``RR_PGDATA`` is set for the soak and its children), in its own database, so
restarting the server never disturbs anyone else's tests. ``DATABASE_URL`` is ignored. A data
directory that served a soak before keeps its migrated database as a template
(``retention_soak_template``): the next soak on it clones that instead of migrating again.

Workers: ``Q_CLUSTER_NAME=cleanup manage.py qcluster`` processes and ``manage.py retention
drain --until-idle`` loops, respawned by the driver when they die (as a supervisor would).

Faults (random, weighted): SIGKILL a cluster's process group, SIGTERM a cluster's MAIN pid
(it must exit by itself: graceful), SIGKILL / SIGTERM a drain process, pg_terminate_backend on
the product's sessions (application_name LIKE 'retention:%'), LOCK TABLE ... IN SHARE MODE
for a few hundred ms, legal holds placed and released later, the policy version superseded
(apply + submit + approve with another chunk_size, then a run triggered for the new version),
duplicate triggers (CLI processes and threads at once), pause + resume, the kill switch, and a
PostgreSQL restart (fast shutdown, then start again).

Each epoch has its own table ``soak_eN`` with a shadow copy ``soak_eN_shadow`` and its own
policy. Eligible rows are far older than any cutoff the soak can produce and young rows far
newer, so every run of an epoch (superseded or scheduled) has the same eligible set and
``runs.evidence.invariants.check_run`` is exact for each of them. With ``--partitioned`` the table is
range-partitioned by day (with a default partition) and its kept rows (and NULL statuses)
sit in the older half of the old rows only, so each run's first pass detaches and drops the
younger half's partitions whole (``runs.engine.partitions``) under the same faults; the report
counts them (``partitions_dropped``).

A fault counts as survived when its own check passed (the cluster exited by itself, the held
rows were all still there at release, the paused run admitted no chunk, the triggers converged
on one run, the superseded run stopped ...), the next invariant check passed, and its epoch
converged (every run terminal, the newest drained, ``check_run`` clean for each).

Prints the table fault kind → injected / survived; ``--json PATH`` saves the whole report.
Exit status 0 when everything converged and every check passed.

Modules: ``bench/soak_common.py`` (settings, records), ``bench/soak_faults.py`` (the faults),
``bench/soak_driver.py`` (database, workers, epochs, the loop), ``bench/soak_report.py`` (checks
and the table).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(ROOT))

from bench.soak_common import log  # noqa: E402
from bench.soak_driver import Driver  # noqa: E402
from bench.soak_faults import ALL_KINDS, Faults  # noqa: E402
from bench.soak_report import Report  # noqa: E402


class Soak(Faults, Report, Driver):
    """One soak: the driver's loop, with the faults it injects and the report it prints."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="long mode: soak this long (epochs)")
    g.add_argument("--seconds", type=float, default=100, help="fault phase length (short mode)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--pgdata", default=None, help="the soak's own embedded data directory")
    p.add_argument("--logdir", default=None)
    p.add_argument("--json", default=None, help="save the report here")
    p.add_argument("--qclusters", type=int, default=2)
    p.add_argument("--drains", type=int, default=2)
    p.add_argument("--pace", type=int, default=700, help="policy pace, rows/s")
    p.add_argument("--chunk-size", type=int, default=100)
    p.add_argument("--fill", type=float, default=0.6, help="old rows = pace × epoch seconds × fill")
    p.add_argument("--interval", type=float, default=0.8, help="mean seconds between faults")
    p.add_argument("--check-every", type=int, default=15, help="faults between invariant checks")
    p.add_argument("--epoch-seconds", type=float, default=300)
    p.add_argument("--restart-every", type=float, default=420)
    p.add_argument("--converge-seconds", type=float, default=120)
    p.add_argument(
        "--until-covered", default="", metavar="KIND,...",
        help="short mode: after --seconds, go on injecting (up to twice as long again) until "
        "each of these faults was injected and a mid-soak invariant check passed",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    p.add_argument(
        "--partitioned", action="store_true",
        help="daily range partitions (and a default one): runs take whole partitions too",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.minutes:
        args.seconds = args.minutes * 60
    args.until_covered = [kind for kind in args.until_covered.split(",") if kind]
    unknown = sorted(set(args.until_covered) - set(ALL_KINDS))
    if unknown:
        p.error(
            f"--until-covered: no such fault {', '.join(unknown)} (faults: {', '.join(ALL_KINDS)})"
        )
    if args.until_covered and args.minutes:
        p.error("--until-covered is for the short mode (--seconds)")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    made = args.pgdata is None
    if made:
        args.pgdata = tempfile.mkdtemp(prefix="rr-soak-")
    args.made_pgdata = made
    if args.logdir is None:
        args.logdir = str(Path(args.pgdata).with_name(Path(args.pgdata).name + "-logs"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # The soak's own server: never the one other tests or the dev server use.
    os.environ["RR_PGDATA"] = args.pgdata
    os.environ.pop("DATABASE_URL", None)
    log(f"soak seed {args.seed}, data {args.pgdata}, logs {args.logdir}")
    soak = Soak(args)
    try:
        return soak.main()
    finally:
        from core import embedded_pg

        embedded_pg.stop()
        if args.made_pgdata and not args.keep:
            shutil.rmtree(args.pgdata, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
