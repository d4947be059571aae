"""What every part of the guard reads: its constants, one query helper, the percentile and
number formats, the policy's inflation budget and whether the latency controller sets its knobs."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from psycopg import sql

from runs.models import Run

log = logging.getLogger(__name__)


IDLE_PROBE_GAP_S = 0.01  # between the probes a sample takes to learn an idle baseline
IDLE_PROBES = 10  # how many: the baseline's p99 is then not one reading's
WINDOW_S = 30.0  # sliding window for probe percentiles
BASELINE_WINDOW_S = 600.0  # idle samples of the last ten minutes make the probe's baseline
BASELINE_MIN_SAMPLES = 5  # fewer idle samples: no baseline, only the absolute threshold
BASELINE_MAX_SAMPLES = 200  # the most recent idle samples at most
# The product tells its own sessions from foreground traffic by application_name "retention:…"
# (config/settings.py); the guard's functions (database/migrations) count the others.
CONFLICTING_MODES = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")


UNREAD = object()  # an argument the caller did not read for us


def _rows(query, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        if isinstance(query, sql.Composable):
            query = query.as_string(cur.connection)
        cur.execute(query, list(params))
        return cur.fetchall()


def _targets() -> list:
    """Specs of the runs that are draining now, one per policy (their tables are what we
    watch)."""
    specs = {}
    for run in Run.objects.filter(state=Run.State.ACTIVE).select_related("policy_version"):
        spec = run.policy_version.parsed
        specs[spec.slug] = spec
    return list(specs.values())


def _since_last_chunk_s(slugs: list[str]) -> float | None:
    """Seconds since the last chunk of these policies committed (its audit row's time, the
    database's clock), None when none ever did: one backward step of ``audit_policy_time``
    per policy."""
    return _rows(
        "SELECT extract(epoch FROM clock_timestamp() - max(last.committed_at))::float8"
        " FROM unnest(%s::text[]) AS p(slug), LATERAL (SELECT committed_at FROM runs_auditrecord"
        "  WHERE policy_slug = p.slug ORDER BY committed_at DESC LIMIT 1) AS last",
        [slugs],
    )[0][0]


def _pct(values: list[float], p: float) -> float:
    """The ``p`` percentile (nearest rank) of sorted ``values``."""
    return round(values[min(len(values) - 1, int(round(p * (len(values) - 1))))], 2)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"
    return str(value)


def controlled(spec) -> bool:
    """Whether the latency controller sets the policy's knobs: the guard and its controller on,
    and a probe to judge by (a policy without one keeps its own settings)."""
    cfg = settings.RETENTION
    return bool(cfg.get("GUARD", True) and cfg["GUARD_CONTROL"] and spec.probe != "none")
