"""Field-by-field difference between two policy specifications (what an approver reviews)."""

from __future__ import annotations

from retention.spec import PolicySpec


def flatten(spec: PolicySpec) -> dict[str, str]:
    """The spec as ``{field: display value}``, one line per reviewable field, in TOML terms."""
    data = spec.to_json()
    out: dict[str, str] = {
        "slug": spec.slug,
        "name": spec.name,
        "owner": spec.owner,
        "table": spec.qualified_table,
        "key": spec.key,
        "timestamp": spec.timestamp,
        "tenant": spec.tenant or "",
        "retention": spec.retention,
        "schedule": spec.schedule,
        "timezone": spec.timezone,
        "chunk_size": str(spec.chunk_size),
        "limits.policy_workers": str(spec.policy_workers),
        "limits.tenant_workers": str(spec.tenant_workers),
        "catch_up": spec.catch_up,
        "overlap": spec.overlap,
        "cascade_ack": ", ".join(spec.cascade_ack),
        "timeouts.lock_ms": str(spec.lock_timeout_ms),
        "timeouts.statement_ms": str(spec.statement_timeout_ms),
        "target_chunk_ms": str(spec.target_chunk_ms),
        "blast_radius": str(spec.blast_radius),
        "max_passes": str(spec.max_passes),
        "vacuum": spec.vacuum,
        "guard.probe": spec.probe,
    }
    out["pace_rows_per_s"] = str(spec.pace_rows_per_s)
    out["slo.max_backlog_age"] = spec.max_backlog_age or ""
    for name in sorted(data["guard"]):
        out[f"guard.{name}"] = str(data["guard"][name])
    for i, rule in enumerate(spec.keep):
        out[f"keep[{i}]"] = rule.describe()
    return out


def spec_diff(old: PolicySpec | None, new: PolicySpec) -> list[dict]:
    """Rows ``{"field", "old", "new", "changed"}`` for every field of either spec.

    With no ``old`` (nothing approved yet) every field is new. Keep rules are compared by
    position (``keep[0]``, ``keep[1]``, ...), so a reordered list shows as changed rules.
    """
    before = flatten(old) if old is not None else {}
    after = flatten(new)
    fields = list(after) + [f for f in before if f not in after]
    rows = []
    for name in fields:
        was, now = before.get(name), after.get(name)
        rows.append(
            {
                "field": name,
                "old": was,
                "new": now,
                "changed": old is not None and was != now,
            }
        )
    return rows
