"""The periods of a version as people read them — the default, each override's and each
class's, with the cutoff each has in a run — and the SQL that counts the rows each lets go.
The preview, the approval card, ``policy plan``, the run page and the manifest all read
these; the DELETE's own condition is ``retention.predicate.within_periods``."""

from __future__ import annotations

from datetime import datetime

from psycopg import sql

from retention import predicate
from retention.spec import PolicySpec

MAX_COUNTED = 50  # entries counted one by one in the preview; the rest together


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def periods(spec: PolicySpec, cutoff: datetime) -> list[dict]:
    """``[{"applies_to", "retention", "cutoff", …}]``: the default first, then each override
    (``tenants``) and each class (``column``, ``value``); ``cutoff`` None for "forever"."""
    rows = [{"applies_to": "default", "retention": spec.retention, "cutoff": _iso(cutoff)}]
    for i, o in enumerate(spec.overrides):
        rows.append({
            "applies_to": f"override[{i}]", "tenants": list(o.tenants),
            "retention": o.retention, "cutoff": _iso(spec.period_cutoff(cutoff, o.retention)),
        })  # fmt: skip
    for i, c in enumerate(spec.classes):
        rows.append({
            "applies_to": f"class[{i}]", "column": c.column, "value": c.value,
            "retention": c.retention, "cutoff": _iso(spec.period_cutoff(cutoff, c.retention)),
        })  # fmt: skip
    return rows


def label(row: dict) -> str:
    """One period as a line: ``acme, globex: 7 years (cutoff …)``."""
    if row["applies_to"] == "default":
        who = "default"
    elif "tenants" in row:
        shown = row["tenants"][:5]
        who = "tenant " + ", ".join(shown) + (f" (+{len(row['tenants']) - 5})" if len(
            row["tenants"]) > 5 else "")  # fmt: skip
    else:
        who = f"{row['column']} = {row['value']!r}"
    cutoff = f"older than {row['cutoff'][:19].replace('T', ' ')}" if row["cutoff"] else "kept"
    return f"{who}: {row['retention']} ({cutoff})"


def matches(spec: PolicySpec) -> list[predicate.Fragment]:
    """Per counted entry (overrides, then classes; at most ``MAX_COUNTED``), SQL TRUE when the
    entry applies to the row; the last one: no override nor class applies (the default)."""
    types = predicate.column_types(spec)
    out: list[predicate.Fragment] = []
    entries = [("o", o) for o in spec.overrides] + [("c", c) for c in spec.classes]
    tenant = spec.tenant_columns[0] if spec.overrides else None
    ctype = types.get(tenant) if tenant else None

    def tenant_in(values) -> predicate.Fragment:
        cast = ctype.cast() if ctype is not None else sql.SQL("pg_catalog.text")
        collate = ctype.collate() if ctype is not None else sql.SQL("")
        return predicate.Fragment(
            sql.SQL("{}{} IN (SELECT v::{} FROM unnest(%s::pg_catalog.text[]) AS v)").format(
                predicate.col(tenant), collate, cast
            ),
            [predicate.array_literal(list(values))],
        )

    for kind, entry in entries[:MAX_COUNTED]:
        if kind == "o":
            out.append(tenant_in(entry.tenants))
        else:
            m = predicate.class_match(spec, entry.value)
            out.append(predicate.Fragment(sql.SQL("({}) IS TRUE").format(m.sql), m.params))
    parts = []
    if spec.overrides:
        parts.append(tenant_in([v for o in spec.overrides for v in o.tenants]))
    if spec.classes:
        for c in spec.classes:
            m = predicate.class_match(spec, c.value)
            parts.append(predicate.Fragment(sql.SQL("({}) IS TRUE").format(m.sql), m.params))
    if parts:
        any_entry = predicate.Fragment.join(parts, " OR ")
        out.append(predicate.Fragment(sql.SQL("NOT ({})").format(any_entry.sql), any_entry.params))
    return out


def counted(spec: PolicySpec, cutoff: datetime, counts: list[int] | None) -> list[dict]:
    """``periods`` with ``eligible`` per row from the preview's counts (``matches`` order:
    the counted entries, then the default); entries past ``MAX_COUNTED`` without a count."""
    rows = periods(spec, cutoff)
    if not counts:
        return rows
    entries = rows[1:]
    for row, n in zip(entries[:MAX_COUNTED], counts[:-1], strict=False):
        row["eligible"] = int(n)
    rows[0]["eligible"] = int(counts[-1])
    return rows
