"""Field-by-field difference between two policy specifications (what an approver reviews).
The fields are ``retention.spec.FIELDS``: a key added to the schema shows in the diff."""

from __future__ import annotations

from retention.spec import ENTRY_PATHS, FIELDS, PolicySpec


def _display(value) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)


def flatten(spec: PolicySpec) -> dict[str, str]:
    """The spec as ``{field: display value}``, one line per reviewable field, in TOML terms."""
    out = {f.path: _display(f.value_of(spec)) for f in FIELDS if f.path not in ENTRY_PATHS}
    for i, rule in enumerate(spec.keep):
        out[f"keep[{i}]"] = rule.describe()
    for i, override in enumerate(spec.overrides):
        out[f"override[{i}]"] = override.describe()
    for i, entry in enumerate(spec.classes):
        out[f"class[{i}]"] = entry.describe()
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
