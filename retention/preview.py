"""The dry-run preview: what a run would delete if it started now, and what it would spare.

Every count comes from aggregate queries that use the exact eligibility predicate of
``retention.predicate`` under the cutoff a run would use now (the latest scheduled
tick, ``retention.schedule_math.latest_tick``). No row of the target table is
brought into Python except the ten sample keys. The queries run under a
``statement_timeout``; a preview that exceeds it says so instead of failing.
"""

from __future__ import annotations

import math
import time
import zoneinfo
from datetime import UTC, datetime

import psycopg
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg import sql

from core.formatting import natural_key
from retention import geometry, introspect, partitions, predicate
from retention import periods as period_rows
from retention.models import LegalHold, PolicyVersion
from retention.schedule_math import latest_tick
from retention.signals import preview_rate_sources
from retention.spec import PolicySpec

PREVIEW_TIMEOUT_MS = 30_000  # at submission: the approver's evidence
LIVE_PREVIEW_TIMEOUT_MS = 10_000  # "preview as of now" on the version page
LIVE_PREVIEW_LOCK = 0x52525056  # advisory lock class of live previews ("RRPV")
LIVE_PREVIEW_CONTENT_LOCK = 0x52525043  # … of a policy file's content not stored ("RRPC")
TOP_TENANTS = 20
SAMPLE_KEYS = 10
MAX_MONTH_BUCKETS = 36
# Assumed pace when the policy has no measured history (rows per second per worker).
ASSUMED_ROWS_PER_SECOND = 50_000


def age_boundaries(oldest: datetime, cutoff: datetime, tz_name: str) -> tuple[list[datetime], str]:
    """Bucket starts from the month (or, past 36 months, the year) of ``oldest`` up to
    ``cutoff``, at midnight on the first in ``tz_name``; and the unit's name."""
    tz = zoneinfo.ZoneInfo(tz_name)
    first, last = oldest.astimezone(tz), cutoff.astimezone(tz)
    months = (last.year - first.year) * 12 + last.month - first.month + 1
    unit = "month" if months <= MAX_MONTH_BUCKETS else "year"
    year, month = first.year, first.month if unit == "month" else 1
    starts = []
    while (year, month) <= (last.year, last.month):
        starts.append(datetime(year, month, 1, tzinfo=tz).astimezone(UTC))
        if unit == "month":
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        else:
            year += 1
    return starts, unit


def _label(start: datetime, unit: str, tz_name: str) -> str:
    local = start.astimezone(zoneinfo.ZoneInfo(tz_name))
    return f"{local:%Y-%m}" if unit == "month" else f"{local:%Y}"


def _oldest_query(spec: PolicySpec, cutoff: datetime):
    """The oldest timestamp before the cutoff, as an instant."""
    older = predicate.older_than(spec, cutoff)
    text = sql.SQL("SELECT min({ts}) FROM {table} WHERE {older}").format(
        ts=predicate.timestamp_instant(spec), table=predicate.table(spec), older=older.sql
    )
    return text, older.params


def _summary_query(
    spec: PolicySpec, *, policy_id: int, cutoff: datetime, boundaries: list[datetime]
):
    """One scan of the rows older than the cutoff, aggregated by tenant with a hash table
    and overall (GROUPING SETS); age buckets are FILTERed counts (at most 36 of them).

    Kept and held are the predicate's own fragments; "eligible" is "not kept and not held"
    among rows older than the cutoff — ``predicate.eligible``. The inner subquery (kept
    from being flattened by ``OFFSET 0``) evaluates each fragment once per row, and the
    hold test only for rows no keep rule protects.
    """
    kept = predicate.kept(spec)
    held = predicate.held(spec, policy_id)
    instant = predicate.timestamp_instant(spec)
    older = predicate.older_than(spec, cutoff)
    # the version's periods: which rows older than the latest cutoff their own period lets go
    in_period = predicate.within_periods(spec, cutoff)
    entries = period_rows.matches(spec) if spec.overrides or spec.classes else []
    entry_select = sql.SQL("").join(
        sql.SQL(", ({}) AS {}").format(frag.sql, sql.Identifier(f"m{i}"))
        for i, frag in enumerate(entries)
    )
    entry_count = sql.SQL("").join(
        sql.SQL(", count(*) FILTER (WHERE e AND {}) AS {}").format(
            sql.Identifier(f"m{i}"), sql.Identifier(f"pc{i}")
        )
        for i in range(len(entries))
    )
    tenant = predicate.tenant_text(spec)
    rules = [predicate.keep_condition(rule) for rule in spec.keep]
    rule_select = sql.SQL("").join(
        sql.SQL(", ({}) IS NOT FALSE AS {}").format(frag.sql, sql.Identifier(f"r{i}"))
        for i, frag in enumerate(rules)
    )
    rule_count = sql.SQL("").join(
        sql.SQL(", count(*) FILTER (WHERE {}) AS {}").format(
            sql.Identifier(f"r{i}"), sql.Identifier(f"kr{i}")
        )
        for i in range(len(rules))
    )
    # width_bucket gives 1..n for rows at or after boundaries[0]
    bucket_count = sql.SQL("").join(
        sql.SQL(", count(*) FILTER (WHERE e AND b = {}) AS {}").format(
            sql.Literal(n), sql.Identifier(f"b{n}")
        )
        for n in range(1, len(boundaries) + 1)
    )
    text = sql.SQL(
        "WITH f AS ("
        "  SELECT tn, b, k_, nk, ts_, kp, h, pv AND NOT kp AND NOT h AND ip AS e{rule_names}"
        "  {entry_names} FROM ("
        "    SELECT {tenant} AS tn, width_bucket({ts}, %s::timestamptz[]) AS b,"
        "           {key} AS k_, ({key_null}) AS nk, {ts} AS ts_, ({kept}) AS kp, ({present}) AS pv,"
        "           CASE WHEN ({kept}) OR NOT ({present}) THEN FALSE ELSE ({held}) END AS h,"
        "           ({in_period}) AS ip"
        "           {rule_select}{entry_select}"
        "    FROM {table} WHERE {older} OFFSET 0"
        "  ) AS per_row"
        "), g AS ("
        "  SELECT GROUPING(tn) AS gt, tn::text AS tn,"
        "         count(*) FILTER (WHERE e) AS eligible,"
        "         count(*) FILTER (WHERE kp) AS kept,"
        "         count(*) FILTER (WHERE h) AS held,"
        "         count(*) AS older,"
        "         count(*) FILTER (WHERE nk) AS null_key,"
        "         count(*) FILTER (WHERE tn IS NULL) AS null_tenant,"
        "         min(ts_) FILTER (WHERE e) AS oldest,"
        "         min(k_) FILTER (WHERE e) AS min_key,"
        "         max(k_) FILTER (WHERE e) AS max_key"
        "         {rule_count}{bucket_count}{entry_count}"
        "  FROM f GROUP BY GROUPING SETS ((tn), ())"
        "), r AS ("
        "  SELECT g.*, count(*) OVER (PARTITION BY gt) AS n_groups,"
        "         row_number() OVER (PARTITION BY gt ORDER BY eligible DESC, tn) AS rank"
        "  FROM g"
        ") SELECT * FROM r WHERE gt = 1 OR rank <= %s"
    ).format(
        rule_names=sql.SQL("").join(
            sql.SQL(", {}").format(sql.Identifier(f"r{i}")) for i in range(len(rules))
        ),
        tenant=tenant,
        ts=instant,
        older=older.sql,
        # the key range is shown for one integer key column (min/max of a row do not exist)
        key=predicate.col(spec.key_columns[0])
        if predicate.integer_key(spec)
        else sql.SQL("NULL::bigint"),
        key_null=sql.SQL(" OR ").join(
            sql.SQL("{} IS NULL").format(predicate.col(c)) for c in spec.key_columns
        ),
        kept=kept.sql,
        present=predicate.has_values(spec).sql,
        held=held.sql,
        rule_select=rule_select,
        table=predicate.table(spec),
        rule_count=rule_count,
        bucket_count=bucket_count,
        in_period=in_period.sql,
        entry_names=sql.SQL("").join(
            sql.SQL(", {}").format(sql.Identifier(f"m{i}")) for i in range(len(entries))
        ),
        entry_select=entry_select,
        entry_count=entry_count,
    )
    params = [
        boundaries,
        *kept.params,
        *kept.params,
        *held.params,
        *in_period.params,
        *[p for frag in rules for p in frag.params],
        *[p for frag in entries for p in frag.params],
        *older.params,
        TOP_TENANTS,
    ]
    return text, params


def _null_timestamp_query(spec: PolicySpec):
    ts = predicate.col(spec.timestamp)
    text = sql.SQL("SELECT count(*) FROM {table} WHERE {ts} IS NULL").format(
        ts=ts, table=predicate.table(spec)
    )
    return text, []


def _sample_query(spec: PolicySpec, *, policy_id: int, cutoff: datetime):
    eligible = predicate.eligible(spec, policy_id=policy_id, cutoff=cutoff)
    key = (
        predicate.col(spec.key_columns[0])
        if predicate.integer_key(spec)
        else sql.SQL("concat_ws(', ', {})").format(predicate.key_texts(spec))
    )  # an integer key's sample keys stay numbers; others are their text forms
    text = sql.SQL("SELECT {key} FROM {table} WHERE {cond} ORDER BY {order} LIMIT %s").format(
        key=key, table=predicate.table(spec), cond=eligible.sql, order=predicate.key_order(spec)
    )
    return text, [*eligible.params, SAMPLE_KEYS]


def measured_rate(slug: str) -> float | None:
    """Rows per second per worker measured for this policy, from the first source that knows
    (``retention.signals.preview_rate_sources``: the run ledger registers its audit trail)."""
    for source in preview_rate_sources:
        rate = source(slug)
        if rate is not None:
            return rate
    return None


def active_holds(policy_id: int | None) -> list[dict]:

    holds = LegalHold.objects.filter(released_at__isnull=True)
    holds = holds.filter(Q(policy__isnull=True) | Q(policy_id=policy_id))
    return [h.scope() for h in holds.select_related("policy")]


def preview(
    spec: PolicySpec,
    *,
    policy_id: int,
    now: datetime | None = None,
    validation=None,
    timeout_ms: int = PREVIEW_TIMEOUT_MS,
) -> dict:
    """Dry-run ``spec`` for the policy ``policy_id`` as of ``now``; a JSON-ready dict.

    ``preview["eligible"]`` is the number of rows a run started now would delete on a
    quiet database (the run engine compares a run's plan against it). Raises SpecError
    when the table no longer validates; reports ``timed_out`` instead of raising when a
    query exceeds ``timeout_ms``.
    """
    now = now or timezone.now()
    if validation is None:
        validation = introspect.validate(spec)
    tick = latest_tick(spec, now)
    cutoff, bound = bounds_now(spec, now)
    result: dict = {
        "taken_at": now.isoformat(),
        "tick": tick.isoformat(),
        "cutoff": cutoff.isoformat(),
        # the version's stage: a slice version's rows are those older than its slice bound
        "rollout": spec.rollout,
        "slice_bound": bound.isoformat() if bound != cutoff else None,
        "table": spec.qualified_table,
        "content_hash": spec.content_hash(),
        # the default, each override's and each class's period: cutoff and rows it lets go
        "periods": period_rows.periods(spec, cutoff),
        "eligible": 0,
        "older_than_cutoff": 0,
        "kept": 0,
        "kept_by_rule": [],
        "held": 0,
        "holds": active_holds(policy_id),
        "tenants": [],
        "tenant_count": 0,
        "other_tenants": None,
        "age_buckets": [],
        "age_bucket_unit": "month",
        # rows never eligible because a planned column is NULL (see predicate.null_rows)
        "not_eligible_null": {
            **({"tenant": 0} if spec.tenant and spec.null_tenant == "keep" else {}),
            "key": 0,
            "timestamp": 0,
        },
        # rows older than the cutoff whose tenant is NULL, and what the policy does with them
        "without_tenant": {"rows": 0, "null_tenant": spec.null_tenant} if spec.tenant else None,
        "oldest_eligible": None,
        "key_range": None,
        "sample_keys": [],
        "chunk_size": spec.chunk_size,
        "estimated_chunks": 0,
        "workers": spec.policy_workers,
        "rows_per_second": None,
        "rate_source": "assumed",
        "drain_seconds": 0.0,
        "partitions": [],
        "rows_taken_whole": 0,
        "partition_note": None,
        "foreign_keys": [fk for fk in validation.to_json()["foreign_keys"]],
        "warnings": list(validation.warnings),
        "chunking": None,
        "timed_out": False,
        "error": None,
        "duration_ms": None,
        "timeout_ms": timeout_ms,
    }
    shape = geometry.choose_safely(spec)  # what a run created now would chunk along
    result["chunking"] = {
        "kind": shape.kind,
        "reason": shape.reason,
        "bounds_on": list(shape.columns),  # empty: the key's columns
    }
    started = time.monotonic()
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT set_config('statement_timeout', %s, true)", [str(timeout_ms)])
            text, params = _null_timestamp_query(spec)
            cur.execute(text, params)
            result["not_eligible_null"]["timestamp"] = cur.fetchone()[0]
            text, params = _oldest_query(spec, bound)
            cur.execute(text, params)
            oldest = cur.fetchone()[0]
            rows: list[dict] = []
            unit = "month"
            if oldest is not None:
                boundaries, unit = age_boundaries(oldest, bound, spec.timezone)
                text, params = _summary_query(
                    spec, policy_id=policy_id, cutoff=bound, boundaries=boundaries
                )
                cur.execute(text, params)
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
                result["age_bucket_unit"] = unit
                text, params = _sample_query(spec, policy_id=policy_id, cutoff=bound)
                cur.execute(text, params)
                result["sample_keys"] = [row[0] for row in cur.fetchall()]
            # per partition of a partitioned table: bounds, rows, kept, held, the action
            result["partitions"] = partitions.plan(spec, policy_id=policy_id, cutoff=bound)
            result["rows_taken_whole"] = sum(
                p["rows"] for p in result["partitions"] if p["action"] in ("drop", "detach")
            )
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
            result["timed_out"] = True
            result["error"] = (
                f"a preview query exceeded the {timeout_ms / 1000:g} s statement timeout"
            )
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            result["error"] = f"preview failed: {first}"
        result["duration_ms"] = round((time.monotonic() - started) * 1000)
        return result
    result["duration_ms"] = round((time.monotonic() - started) * 1000)
    if rows:
        _fill(result, spec, rows, boundaries, unit)
    result["partition_note"] = partition_note(result["partitions"], spec.chunk_size)
    result["would"] = stage_sentence(spec, result["eligible"])
    return result


def partition_note(partitions: list[dict], chunk_size: int) -> str | None:
    """What keeps partitions past the cutoff from going whole, and what it costs: their
    eligible rows are deleted row by row in chunks instead of with a few drops. None when
    every such partition can go whole (or there is none)."""
    past = [p for p in partitions if p["past_cutoff"] and p["rows"]]
    blocked = [p for p in past if p["held"] or p["kept"]]
    if not blocked:
        return None
    held = sum(1 for p in blocked if p["held"])
    kept = sum(1 for p in blocked if p["kept"])
    every = len(blocked) == len(past)
    reasons = []
    if held:
        reasons.append(f"legal holds cover rows in {'all ' if held == len(past) else ''}{held}")
    if kept:
        reasons.append(f"keep rules in {kept}")
    why = reasons[0] + " of them" + (f" ({reasons[1]})" if len(reasons) > 1 else "")
    rows = sum(p["eligible"] for p in blocked)
    chunks = math.ceil(rows / chunk_size) if rows else 0
    head = (
        "No partition past the cutoff can be dropped whole"
        if every
        else f"{len(blocked)} of the {len(past)} partitions past the cutoff cannot be dropped whole"
    )
    return (
        f"{head}: {why}. Their {rows:,} eligible rows are deleted row by row instead, in about "
        f"{chunks:,} chunks, rather than with {len(blocked)} partition drop"
        f"{'s' if len(blocked) != 1 else ''}."
    )


def without_tenant_text(without: dict) -> str:
    """The preview's rows without a tenant and what the policy does with them, in words."""
    verb = "deleted with the others" if without["null_tenant"] == "delete" else "kept"
    return (
        f"rows without a tenant: {without['rows']:,}, {verb} "
        f'(null_tenant = "{without["null_tenant"]}")'
    )


ELIGIBLE_NOW_TIMEOUT_MS = 2_000
ELIGIBLE_NOW_LIMIT = 10_000_000


def bounds_now(spec: PolicySpec, now: datetime) -> tuple[datetime, datetime]:
    """(cutoff, bound) of a run of ``spec`` started at ``now``: the cutoff of the latest
    tick, and what its DELETE compares the timestamp with — a slice version's slice bound
    (cutoff − slice), else the cutoff. The one rule every number that judges a version uses
    (preview, approval card, ``policy plan``, drain window), as the run itself does."""
    cutoff = spec.cutoff_for(latest_tick(spec, now))
    return cutoff, spec.slice_bound(cutoff) or cutoff


def stage_sentence(spec: PolicySpec, rows: int | None) -> str:
    """What a run of this version does with ``rows`` (its eligible count): a count version
    "would count N, deletes nothing"; a slice version "would delete N (older than the slice
    bound)"; a full one "would delete N"."""
    n = "?" if rows is None else f"{rows:,}"
    if spec.rollout == "count":
        return f"would count {n}, deletes nothing"
    if spec.rollout == "slice":
        return f"would delete {n} (older than the cutoff − {spec.slice})"
    return f"would delete {n}"


def eligible_now(spec: PolicySpec, policy_id: int, now: datetime) -> int | None:
    """Rows a run of ``spec`` started at ``now`` would delete — or, for a count version,
    count (``bounds_now``: its cutoff or slice bound, keep rules and the active holds): what
    an approver compares between two versions, both counted on the table as it is now. None
    when the count does not finish within its statement timeout (or the table cannot be
    read); it stops at ``ELIGIBLE_NOW_LIMIT``."""
    where = predicate.eligible(spec, policy_id=policy_id, cutoff=bounds_now(spec, now)[1])
    frag = predicate.count_where(spec, where, limit=ELIGIBLE_NOW_LIMIT)
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL statement_timeout = %s", [ELIGIBLE_NOW_TIMEOUT_MS])
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            return int(cur.fetchone()[0])
    except DatabaseError:
        return None


def live_preview(version) -> dict:
    """``preview`` of a version as of now, for the version page, ``retention policy preview``
    and the API: computed at most once per version and minute across every web process (a
    transaction-level advisory lock per version; whoever waited reads the cached result),
    under ``LIVE_PREVIEW_TIMEOUT_MS``. The result is informational; approval binds to the
    preview taken at submission."""
    return _bounded(
        version.parsed,
        policy_id=version.policy_id,
        key=f"{version.pk}:{version.content_hash}",
        lock=(LIVE_PREVIEW_LOCK, version.pk),
    )


def live_preview_of_spec(spec: PolicySpec, *, policy_id: int | None) -> dict:
    """``live_preview`` of a policy file that is not (yet) a version — a plan's: the version
    of that content when the policy has one, else bounded the same way per content (its own
    advisory lock and cache entry per policy and content hash, once a minute)."""
    content_hash = spec.content_hash()
    if policy_id is not None:
        version = (
            PolicyVersion.objects.filter(policy_id=policy_id, content_hash=content_hash)
            .order_by("-number")
            .first()
        )
        if version is not None:
            return live_preview(version)
    return _bounded(
        spec,
        policy_id=policy_id,
        key=f"spec:{policy_id}:{content_hash}",
        lock=(
            LIVE_PREVIEW_CONTENT_LOCK,
            int.from_bytes(bytes.fromhex(content_hash[:8]), "big", signed=True),
        ),
    )


def _bounded(spec: PolicySpec, *, policy_id: int | None, key: str, lock: tuple[int, int]) -> dict:
    now = timezone.now()
    key = f"live-preview:{key}:{now:%Y%m%d%H%M}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", list(lock))
        cached = cache.get(key)
        if cached is not None:
            return cached
        result = preview(spec, policy_id=policy_id, now=now, timeout_ms=LIVE_PREVIEW_TIMEOUT_MS)
        cache.set(key, result, timeout=120)
    return result


def _fill(
    result: dict, spec: PolicySpec, rows: list[dict], boundaries: list[datetime], unit: str
) -> None:
    total = next((r for r in rows if r["gt"] == 1), None)
    if total is None:  # no row older than the cutoff at all
        return
    result["eligible"] = int(total["eligible"])
    result["older_than_cutoff"] = int(total["older"])
    result["kept"] = int(total["kept"])
    result["held"] = int(total["held"])
    result["not_eligible_null"]["key"] = int(total["null_key"])
    if spec.tenant:
        result["without_tenant"]["rows"] = int(total["null_tenant"])
        if spec.null_tenant == "keep":
            result["not_eligible_null"]["tenant"] = int(total["null_tenant"])
    result["oldest_eligible"] = total["oldest"].isoformat() if total["oldest"] else None
    if total["min_key"] is not None:
        result["key_range"] = [int(total["min_key"]), int(total["max_key"])]
    result["kept_by_rule"] = [
        {"rule": rule.describe(), "rows": int(total[f"kr{i}"])} for i, rule in enumerate(spec.keep)
    ]
    counts = [total[k] for k in sorted((k for k in total if k.startswith("pc")),
                                       key=lambda k: int(k[2:]))]  # fmt: skip
    if counts:
        result["periods"] = period_rows.counted(spec, datetime.fromisoformat(result["cutoff"]),
                                                counts)  # fmt: skip
    if spec.tenant:
        tenants = sorted(
            (r for r in rows if r["gt"] == 0),
            key=lambda r: (-r["eligible"], r["tn"] is None, natural_key(r["tn"])),
        )
        result["tenants"] = [
            {
                "tenant": r["tn"],
                "eligible": int(r["eligible"]),
                "kept": int(r["kept"]),
                "held": int(r["held"]),
            }
            for r in tenants
        ]
        count = int(tenants[0]["n_groups"]) if tenants else 0
        result["tenant_count"] = count
        if count > len(tenants):
            shown = sum(t["eligible"] for t in result["tenants"])
            result["other_tenants"] = {
                "tenants": count - len(tenants),
                "eligible": result["eligible"] - shown,
            }
    result["age_buckets"] = [
        {"label": _label(start, unit, spec.timezone), "eligible": int(total[f"b{i + 1}"])}
        for i, start in enumerate(boundaries)
    ]
    eligible = result["eligible"]
    result["estimated_chunks"] = math.ceil(eligible / spec.chunk_size) if eligible else 0
    if not eligible:  # nothing to drain: no time, and no rate to quote
        return
    rate = measured_rate(spec.slug)
    if rate is not None:
        result["rate_source"] = "measured"
    else:
        rate = float(ASSUMED_ROWS_PER_SECOND)
    result["rows_per_second"] = round(rate * spec.policy_workers)
    if spec.pace_rows_per_s and spec.pace_rows_per_s < result["rows_per_second"]:
        result["rows_per_second"] = spec.pace_rows_per_s
        result["rate_source"] += ", capped by pace_rows_per_s"
    result["drain_seconds"] = round(eligible / result["rows_per_second"], 1)
