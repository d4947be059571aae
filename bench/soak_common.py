"""The chaos soak's shared vocabulary: its settings, the records it keeps (a fault, a worker, an
epoch) and its log line. ``bench/soak.py`` is the entry point (docs/chaos.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOAK_DB = "retention_soak"
SOAK_TEMPLATE = "retention_soak_template"  # the migrated database, cloned by the next soak
DRIVER_APP = "soak-driver"

# The engine's timing, shortened so that lost leases and redeliveries happen within the soak.
ENGINE_ENV = {
    "RETENTION_LEASE_BUDGET_S": "3",
    "RETENTION_Q_TIMEOUT": "10",
    "RETENTION_Q_RETRY": "12",
    "RETENTION_LEASE_STALE_S": "8",
    "RETENTION_PLANNER_WINDOW": "16",
    "CLEANUP_WORKERS": "2",
    "DB_CONN_MAX_AGE": "30",
    "LOG_LEVEL": "WARNING",
    "RETENTION_BROKER": "orm",
}

MAX_SUPERSEDES = 80  # per epoch; the data leaves a gap of this many hours around the cutoffs
SIGTERM_GRACE_S = 30.0
SLACK_S = 2.0  # a chunk admitted just before a pause commits may start this much later


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass
class Fault:
    kind: str
    at: float
    epoch: int
    ok: bool | None = None  # its own check: None until known
    note: str = ""
    checked: bool = False  # an invariant check passed after it


@dataclass
class Worker:
    kind: str  # "qcluster" | "drain"
    name: str
    proc: subprocess.Popen | None = None
    respawn_at: float = 0.0
    terminating: Fault | None = None
    term_deadline: float = 0.0
    starts: int = 0


@dataclass
class Epoch:
    n: int
    table: str
    slug: str
    policy_id: int = 0
    ticks: list = field(default_factory=list)
    supersedes: int = 0
    converged: bool = False
    problems: list = field(default_factory=list)
    runs: dict = field(default_factory=dict)
    rows_deleted: int = 0
    eligible: int = 0
