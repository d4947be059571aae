"""/metrics in Prometheus text format, read from the ledger at scrape time.

A custom collector on a private registry: every scrape runs a handful of grouped
queries, so the numbers are the database's, never a process's counters (which would
differ between web processes and reset on restart).
"""

from __future__ import annotations

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Max
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from retention.models import Policy
from retention.schedule_math import latest_tick
from runs.fleet import view as fleet_view
from runs.models import AuditRecord, Chunk, DeadLetter, Run
from runs.pages.contexts import policy_readings
from runs.progress import progress_for
from targets import connections as fleet_connections

# Upper bounds (seconds) of the chunk-duration histogram buckets.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def reason_class(reason: str) -> str:
    """A throttle reason without its numbers (``probe p95 41 ms > 25 ms`` → ``probe p95``),
    so the label has few values."""
    words = []
    for word in reason.split():
        if word[0].isdigit() or word[0] in "<>=(:":
            break
        words.append(word.strip(",;:"))
    return " ".join(words)[:60] or "other"


AUDIT_TOTALS_KEY = "metrics:audit-totals:v1"


def _empty_totals() -> dict:
    return {"buckets": [0] * len(DURATION_BUCKETS), "sum": 0.0, "count": 0, "rows": 0}


def audit_totals() -> dict[str, dict]:
    """Per policy, over every audit record: rows deleted and the chunk-duration histogram
    (cumulative bucket counts, sum and count of committed_at - started_at).

    The audit trail is append-only and ``chain_seq`` is assigned under a lock held to
    commit, so records up to the highest visible ``chain_seq`` never change: the totals up
    to there are kept in the shared cache with that record's hash, and a scrape reads only
    newer records (one index range). If the remembered record is gone or different (a
    restored or rebuilt database), the totals are computed again from the start.
    """
    state = cache.get(AUDIT_TOTALS_KEY)
    if state:
        still = AuditRecord.objects.filter(chain_seq=state["seq"], hash=state["hash"]).exists()
        if not still:
            state = None
    if not state:
        state = {"seq": 0, "hash": "", "policies": {}}
    bounds = ", ".join(
        f"count(*) FILTER (WHERE d <= {float(b)!r})" for b in DURATION_BUCKETS
    )  # constants only
    sql = f"""
        SELECT policy_slug, {bounds}, coalesce(sum(d), 0), count(*),
               coalesce(sum(rows_deleted), 0), max(chain_seq)
        FROM (SELECT policy_slug, rows_deleted, chain_seq,
                     extract(epoch FROM committed_at - started_at)::float8 AS d
              FROM runs_auditrecord WHERE chain_seq > %s) AS t
        GROUP BY policy_slug
    """  # noqa: S608
    k = len(DURATION_BUCKETS)
    with connection.cursor() as cur:
        cur.execute(sql, [state["seq"]])
        rows = cur.fetchall()
    if not rows:
        return state["policies"]
    for row in rows:
        slug = row[0]
        totals = state["policies"].setdefault(slug, _empty_totals())
        totals["buckets"] = [a + b for a, b in zip(totals["buckets"], row[1 : 1 + k], strict=True)]
        totals["sum"] += float(row[1 + k])
        totals["count"] += row[2 + k]
        totals["rows"] += int(row[3 + k])
    top = max(row[4 + k] for row in rows)
    state["seq"] = top
    state["hash"] = AuditRecord.objects.filter(chain_seq=top).values_list("hash", flat=True).get()
    cache.set(AUDIT_TOTALS_KEY, state, timeout=None)
    return state["policies"]


def run_families(progress) -> list[GaugeMetricFamily]:
    """Per open run: the figures the pages and ``retention status`` show, from the same model."""
    labels = ["policy", "run"]
    deleted = GaugeMetricFamily(
        "retention_run_rows_deleted", "Rows deleted so far by an open run", labels=labels
    )
    expected = GaugeMetricFamily(
        "retention_run_rows_expected",
        "Rows an open run is expected to delete in all: the eligible count at admission, kept"
        " between the rows deleted and what its planned chunks can delete at most (0: unknown)",
        labels=labels,
    )
    ratio = GaugeMetricFamily(
        "retention_run_progress_percent", "An open run's progress in percent", labels=labels
    )
    eta = GaugeMetricFamily(
        "retention_run_eta_seconds",
        "Estimated seconds until an active run drains (absent without a recent rate)",
        labels=labels,
    )
    for p in progress:
        key = [p.policy_slug, p.run_key]
        deleted.add_metric(key, p.rows_deleted)
        expected.add_metric(key, p.rows_expected)
        ratio.add_metric(key, p.percent)
        if p.eta_s is not None:
            eta.add_metric(key, p.eta_s)
    return [deleted, expected, ratio, eta]


class LedgerCollector:
    """Reads the ledger at scrape time."""

    def collect(self):
        now = timezone.now()
        policies = list(Policy.objects.all())
        by_id = {p.id: p.slug for p in policies}

        backlog = GaugeMetricFamily(
            "retention_oldest_eligible_row_age_seconds",
            "Age of the oldest row still eligible for deletion",
            labels=["policy"],
        )
        guard_value = GaugeMetricFamily(
            "retention_guard_signal_value", "Latest guard signal value", labels=["policy", "signal"]
        )
        guard_threshold = GaugeMetricFamily(
            "retention_guard_signal_threshold",
            "Guard signal threshold",
            labels=["policy", "signal"],
        )
        guard_level = GaugeMetricFamily(
            "retention_guard_throttled",
            "1 when the guard is refusing new chunks (2 when critical)",
            labels=["policy"],
        )
        on_its_own = GaugeMetricFamily(
            "retention_guard_foreground_over_budget",
            "1 when the foreground is over its latency limit on its own: no chunk of the policy"
            " in flight for the controller's whole period (admission stays closed)",
            labels=["policy"],
        )
        converges = GaugeMetricFamily(
            "retention_drain_converges",
            "1 when the policy's backlog converges (or nothing waits), 0 when it is at risk,"
            " paused or stopped; NaN while not known yet (no rate measured)",
            labels=["policy"],
        )
        overdue = GaugeMetricFamily(
            "retention_backlog_overdue_seconds",
            "How long the oldest eligible row has waited past its retention",
            labels=["policy"],
        )
        slo = GaugeMetricFamily(
            "retention_backlog_slo_seconds",
            "The policy's backlog SLO: [slo] max_backlog_age of its approved version",
            labels=["policy"],
        )
        due_tick = GaugeMetricFamily(
            "retention_last_scheduled_tick_timestamp_seconds",
            "The policy's newest scheduled tick since its version was approved (unix time;"
            " enabled, unpaused policies only)",
            labels=["policy"],
        )
        run_tick = GaugeMetricFamily(
            "retention_last_run_tick_timestamp_seconds",
            "The tick of the policy's newest run (unix time)",
            labels=["policy"],
        )
        for policy_id, tick in (
            Run.objects.values_list("policy_id").annotate(t=Max("tick")).order_by()
        ):
            run_tick.add_metric([by_id.get(policy_id, "?")], tick.timestamp())
        # What every policy's figures need, read once for all of them (as the overview does).
        readings = policy_readings(policies, now)
        # Ids first: a join would make the planner walk every chunk of every run. Read once,
        # for the chunk and run families below (every open run, not only each policy's first).
        open_runs = list(Run.objects.filter(state__in=Run.OPEN).values_list("id", flat=True))
        unread = [i for i in open_runs if i not in readings.progress]
        progress = {i: readings.progress[i] for i in open_runs if i in readings.progress}
        if unread:  # a policy's second open run (its first is the one being worked)
            progress.update(
                progress_for(
                    unread, now=now, broker=readings.broker, kill_switch=readings.kill_switch
                )
            )
        for policy in policies:
            window = readings.drain_window(policy)
            age = window.get("oldest_eligible_age_s")
            if age is not None:
                backlog.add_metric([policy.slug], float(age))
            if window.get("overdue_s") is not None:
                overdue.add_metric([policy.slug], max(0.0, float(window["overdue_s"])))
            version = readings.approved.get(policy.id)
            if version is not None:
                if version.parsed.max_backlog_age_s is not None:
                    slo.add_metric([policy.slug], version.parsed.max_backlog_age_s)
                tick = latest_tick(policy, now)
                if policy.enabled and not policy.paused and tick >= (version.decided_at or now):
                    due_tick.add_metric([policy.slug], tick.timestamp())
            verdict = window.get("verdict")
            if verdict in ("converges", "idle"):
                converges.add_metric([policy.slug], 1)
            elif verdict in ("at risk", "paused", "stopped"):
                converges.add_metric([policy.slug], 0)
            else:  # an alert comparing it with 0 or 1 does not fire on a NaN
                converges.add_metric([policy.slug], float("nan"))
            state = readings.guard_state(policy)
            latency = state.get("latency") or {}
            on_its_own.add_metric([policy.slug], 1 if latency.get("on_its_own") else 0)
            level = state.get("level", "ok")
            guard_level.add_metric(
                [policy.slug], {"ok": 0, "throttled": 1, "critical": 2}.get(level, 0)
            )
            for name, signal in (state.get("signals") or {}).items():
                if signal.get("value") is not None:
                    guard_value.add_metric([policy.slug, name], float(signal["value"]))
                if signal.get("threshold") is not None:
                    guard_threshold.add_metric([policy.slug, name], float(signal["threshold"]))
        yield from (backlog, overdue, slo, due_tick, run_tick)
        yield from (guard_value, guard_threshold, guard_level, on_its_own, converges)

        queue_age = GaugeMetricFamily(
            "retention_queue_age_seconds",
            "Age of the oldest pending chunk of an open run",
            labels=["policy"],
        )
        oldest: dict[str, float] = {}
        for p in progress.values():
            if p.queue_age_s is not None:
                oldest[p.policy_slug] = max(oldest.get(p.policy_slug, 0.0), p.queue_age_s)
        for slug, age in oldest.items():
            queue_age.add_metric([slug], age)
        yield queue_age

        broker = readings.broker
        yield GaugeMetricFamily(
            "retention_broker_oldest_message_age_seconds",
            "Age of the oldest django-q2 message not yet taken by a worker",
            value=broker.oldest_age_s or 0.0,
        )
        yield GaugeMetricFamily(
            "retention_broker_messages_waiting",
            "django-q2 messages not yet taken by a worker",
            value=broker.waiting,
        )

        chunks = GaugeMetricFamily(
            "retention_chunks", "Chunks of open runs by state", labels=["policy", "state"]
        )
        retries = GaugeMetricFamily(
            "retention_chunk_retries",
            "Retries in open runs: sum of attempts - 1 over chunks tried more than once",
            labels=["policy"],
        )
        by_state: dict[tuple[str, str], int] = {}
        retry_sum: dict[str, int] = {}
        for p in progress.values():
            for state, n in p.chunks.items():
                if n:
                    key = (p.policy_slug, state)
                    by_state[key] = by_state.get(key, 0) + n
            retry_sum[p.policy_slug] = retry_sum.get(p.policy_slug, 0) + p.retries
        for key, n in by_state.items():
            chunks.add_metric(list(key), n)
        for slug, total in retry_sum.items():
            retries.add_metric([slug], total)
        yield chunks
        yield retries
        yield from run_families(progress.values())

        throttled = GaugeMetricFamily(
            "retention_throttled_chunks",
            "Pending chunks held back by the guard, by reason",
            labels=["policy", "reason"],
        )
        counts: dict[tuple[str, str], int] = {}
        for policy_id, reason, n in (
            Chunk.objects.throttled(now)
            .values_list("run__policy_id", "throttle_reason")
            .annotate(n=Count("id"))
            .order_by()
        ):
            key = (by_id.get(policy_id, "?"), reason_class(reason))
            counts[key] = counts.get(key, 0) + n
        for key, n in counts.items():
            throttled.add_metric(list(key), n)
        yield throttled

        totals = audit_totals()
        deleted = CounterMetricFamily(
            "retention_rows_deleted", "Rows deleted (sum over audit records)", labels=["policy"]
        )
        for slug, t in totals.items():
            deleted.add_metric([slug], t["rows"])
        yield deleted

        letters = GaugeMetricFamily(
            "retention_dead_letters_open", "Dead letters waiting for a person", labels=["policy"]
        )
        open_by_policy = dict(
            DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN)
            .values_list("run__policy_id")
            .annotate(n=Count("id"))
            .order_by()
        )
        for policy in policies:
            letters.add_metric([policy.slug], open_by_policy.get(policy.id, 0))
        unattached = open_by_policy.get(None, 0)
        if unattached:
            letters.add_metric(["?"], unattached)
        yield letters

        durations = HistogramMetricFamily(
            "retention_chunk_duration_seconds",
            "Chunk transaction time (audit committed_at - started_at)",
            labels=["policy"],
        )
        for slug, t in totals.items():
            buckets = [(repr(b), c) for b, c in zip(DURATION_BUCKETS, t["buckets"], strict=True)]
            buckets.append(("+Inf", t["count"]))
            durations.add_metric([slug], buckets, t["sum"])
        yield durations

        drained = GaugeMetricFamily(
            "retention_last_drained_run_timestamp_seconds",
            "When the policy's latest run finished drained (unix time)",
            labels=["policy"],
        )
        for policy_id, at in (
            Run.objects.filter(state=Run.State.DRAINED, finished_at__isnull=False)
            .values_list("policy_id")
            .annotate(at=Max("finished_at"))
            .order_by()
        ):
            drained.add_metric([by_id.get(policy_id, "?")], at.timestamp())
        yield drained

        yield GaugeMetricFamily(
            "retention_kill_switch_on",
            "1 while the global kill switch is on",
            value=1 if readings.kill_switch and readings.kill_switch.on else 0,
        )
        yield from fleet_families(policies, readings)


def fleet_families(policies, readings) -> list[GaugeMetricFamily]:
    """The fleet, labelled by ``target`` (runs.fleet.view: each target's ledger, waiting at
    most ``PAGE_WAIT_S`` in all for the readings this scrape started, never on one noted
    unreachable): whether each target answers, and per policy over other targets the state of
    its latest run on each. A target still being read has no sample in this scrape."""
    targets = {
        pid: fleet_connections.resolve(version.parsed.targets)
        for pid, version in readings.approved.items()
    }
    fleet = fleet_view.fleet_of(policies, targets, wait_s=fleet_view.PAGE_WAIT_S)
    up = GaugeMetricFamily(
        "retention_target_up", "1 when the target answered its last reading", labels=["target"]
    )
    converged = GaugeMetricFamily(
        "retention_target_converged",
        "1 when the policy's latest period drained on the target (0: a laggard)",
        labels=["policy", "target"],
    )
    by_id = {p.id: p.slug for p in policies}
    seen: dict[str, bool] = {}
    for pid, row in fleet.items():
        for t in row["targets"]:
            if t["reading"]:
                continue
            seen[t["target"]] = t["reachable"]
            converged.add_metric([by_id[pid], t["target"]], 0 if t["why"] else 1)
    for name, reachable in sorted(seen.items()):
        up.add_metric([name], 1 if reachable else 0)
    return [up, converged]


def render_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector())
    return generate_latest(registry)
