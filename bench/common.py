"""Shared helpers of the benchmark scripts: where the bench database is, percentiles, timing.

The benchmarks use their own database (``retention_bench``) on the project's embedded
PostgreSQL server, so they never touch the dev or test database. ``BENCH_SERVER_URL``
points them at another server instead (any database URL on it; the bench database is
created next to it).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("BENCH_DATABASE", "retention_bench")
SCHEMA = "bench"


def server_url() -> str:
    """A URL of any database on the bench server (starts the embedded server if needed)."""
    url = os.environ.get("BENCH_SERVER_URL")
    if url:
        return url
    sys.path.insert(0, str(ROOT))
    from core import embedded_pg

    return embedded_pg.database_url()


def with_database(url: str, name: str) -> str:
    """The same server URL, naming database ``name``."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = name
    # Django's settings want a postgresql:// URL; rebuild one from the parts.
    host = params.pop("host", "")
    port = params.pop("port", "")
    user = params.pop("user", "postgres")
    password = params.pop("password", "")
    dbname = params.pop("dbname")
    auth = f"{user}:{password}@" if password else f"{user}@"
    query = []
    if host.startswith("/"):
        query.append(f"host={host}")
        if port:
            query.append(f"port={port}")
        netloc = ""
    else:
        netloc = host + (f":{port}" if port else "")
    query += [f"{k}={v}" for k, v in params.items()]
    out = f"postgresql://{auth}{netloc}/{dbname}"
    if query:
        out += "?" + "&".join(query)
    make_conninfo(out)  # fail early on a malformed URL
    return out


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1)))))
    return ordered[rank]


def peak_rss_kb() -> int:
    """Peak resident set size of this process (VmHWM), in KiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the machine's cores have been busy since boot, all cores together
    (``/proc/stat``: every state but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _ticks()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds process ``pid`` (all its threads) has used, user and system; None where
    ``/proc`` does not show it (a database server on another machine)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _ticks()


def cpu_mark(backend_pids) -> dict:
    """Where this process's CPU and that of its connections' backends (``backend_pids``)
    stand now, for ``cpu_spent``."""
    return {"own": time.process_time(), "backends": {p: process_cpu_s(p) for p in backend_pids}}


def cpu_spent(mark: dict) -> dict:
    """The CPU seconds spent since ``mark`` (``cpu_mark``): this process's (all its threads,
    ``self_s``) and its backends' (``backends_s``; None where ``/proc`` does not show them)."""
    spent = [
        now - then
        for pid, then in mark["backends"].items()
        if then is not None and (now := process_cpu_s(pid)) is not None
    ]
    return {
        "self_s": round(time.process_time() - mark["own"], 3),
        "backends_s": round(sum(spent), 3) if spent else None,
    }
