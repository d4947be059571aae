"""The normalized specification of a policy version, and its parser.

One parser serves the TOML files, the forms and the stored JSON, so every
path into a policy gets the same checks. It checks shape only; whether the
table and columns exist is ``retention.introspect``'s job.
"""

from __future__ import annotations

import calendar
import difflib
import hashlib
import json
import re
import tomllib
import zoneinfo
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta

import tomli_w
from croniter import CroniterBadDateError, croniter

KEEP_OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "is null", "is not null")
NULLARY_OPERATORS = ("is null", "is not null")
LIST_OPERATORS = ("in", "not in")
RETENTION_UNITS = {"minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
# Units a retention may also be written in: calendar units, on the policy's wall clock.
CALENDAR_MONTHS = {"month": 1, "year": 12}
# Units read on the policy's wall clock (the others are elapsed time).
WALL_CLOCK_UNITS = ("day", "week", "month", "year")
TIMESTAMP_UNITS = ("s", "ms", "us")  # an epoch timestamp column's unit
NULL_TENANT_CHOICES = ("keep", "delete")
CATCH_UP_MODES = ("latest", "none")
OVERLAP_MODES = ("wait", "skip")
VACUUM_MODES = ("recommend", "run", "off")
PARTITION_ACTIONS = ("drop", "detach")
# How far a version's runs go (docs/policies.md, "Rolling out a policy"): count what a full run
# would delete and delete nothing; delete only rows older than the cutoff minus ``slice``; or
# delete everything eligible.
ROLLOUT_STAGES = ("count", "slice", "full")
# Bounds on a policy file, so no input makes the parser, the preview or the DELETE unbounded.
MAX_POLICY_BYTES = 512 * 1024  # room for thousands of per-tenant overrides
MAX_KEEP_RULES = 32
MAX_KEEP_VALUES = 1000  # per "in" / "not in" list
MAX_OVERRIDE_TENANTS = 10_000  # tenant values across all [[override]] entries
MAX_CLASSES = 32
# The period of an override or a class that keeps its rows for good.
FOREVER = "forever"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")
_RETENTION = re.compile(r"^\s*(\d+)\s*(minute|hour|day|week|month|year)s?\s*$")

GUARD_DEFAULTS = {
    "probe_p95_ms": 25.0,
    "lock_waits": 5,
    "replication_lag_s": 30.0,
    "dead_tuple_ratio": 0.9,
    "connections_headroom": 10,
    "wal_mb_per_s": 200.0,
    "critical_probe_p95_ms": 250.0,
    "critical_lock_waits": 50,
    "critical_replication_lag_s": 300.0,
}


class SpecError(ValueError):
    """A policy specification is malformed; the message names the field. ``field``: the key
    it is about (``chunk_sise``, ``keep[0].column``), for ``located`` to find its line."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'chunk_size'?)`` for the closest of ``choices``, else ''."""
    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


_FIELD_AT_START = re.compile(r"^(?:keep\[\d+\]:? ?)?([A-Za-z_][\w.]*(?:\[\d+\])?(?:\.\w+)?)\b")


def line_of(text: str, field: str) -> int | None:
    """The line (from 1) of a policy file's ``text`` where ``field`` is set: ``chunk_size``,
    ``limits.policy_workers`` (under ``[limits]``), ``keep[1].column`` (in the second
    ``[[keep]]``); None when it is not written there."""
    if not field:
        return None
    section, index, key = "", None, field
    found = re.fullmatch(r"(\w+)(?:\[(\d+)\])?\.(\w+)", field)
    if found:
        section, index, key = found.group(1), found.group(2), found.group(3)
    elif re.fullmatch(r"(\w+)\[(\d+)\]", field):
        section, index = re.fullmatch(r"(\w+)\[(\d+)\]", field).groups()
        key = ""
    current, seen = "", -1
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\[?\s*(\w+)\s*\]\]?.*", stripped)
        if header:
            current = header.group(1)
            if current == section and stripped.startswith("[["):
                seen += 1
            if section and not key and current == section and str(seen) == str(index):
                return number
            continue
        if not re.match(rf'^"?{re.escape(key)}"?\s*=', stripped) or not key:
            continue
        if section == "" and current == "":
            return number
        if current == section and (index is None or str(seen) == str(index)):
            return number
    return None


def located(exc: SpecError, text: str) -> SpecError:
    """``exc`` with the line of the file it is about in front (``line 7: …``), when found."""
    field = exc.field
    if not field:
        match = _FIELD_AT_START.match(str(exc))
        field = match.group(1) if match else ""
        found = re.match(r"^keep\[(\d+)\]:? (?:column '?(\w+)'?)?", str(exc))
        if found:
            field = (
                f"keep[{found.group(1)}].column" if found.group(2) else f"keep[{found.group(1)}]"
            )
    number = line_of(text, field)
    if number is None or str(exc).startswith("line "):
        return exc
    out = SpecError(f"line {number}: {exc}", field=field)
    out.line = number
    return out


MAX_KEY_COLUMNS = 4
MAX_TENANT_COLUMNS = 4


def _key(value, where: str = "key", most: int = MAX_KEY_COLUMNS) -> str | tuple[str, ...]:
    """The key (or the tenant): one column name, or a list of distinct names (a composite key,
    compared as a row). A one-element list is the column itself, so its content hash is the
    plain name's."""
    if isinstance(value, list):
        if not value or len(value) > most:
            raise SpecError(f"{where} must list 1 to {most} columns, got {len(value)}")
        names = tuple(_ident(v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(set(names)) != len(names):
            raise SpecError(f"{where} lists a column twice: {', '.join(names)}")
        return names[0] if len(names) == 1 else names
    return _ident(value, where)


def _ident(value, where: str) -> str:
    if not isinstance(value, str) or not _IDENT.fullmatch(value):
        raise SpecError(
            f"{where} must be a plain SQL identifier (letters, digits, _), got {value!r}"
        )
    return value


def _int(value, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{where} must be between {lo} and {hi}, got {value}")
    return value


def _number(value, where: str, lo: float, hi: float, like: float | int = 0.0) -> float | int:
    """A number in [lo, hi], in the canonical form of its field (``like``: the default's
    type): a float field is always a float, an integer field an integer when the value is
    whole — `probe_p95_ms = 25` and `25.0` are one policy with one content hash."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{where} must be between {lo} and {hi}, got {value}")
    if isinstance(like, float):
        return float(value)
    return int(value) if float(value).is_integer() else float(value)


def _choice(value, where: str, choices) -> str:
    if value not in choices:
        raise SpecError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _no_unknown(data: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        section = where if re.fullmatch(r"\w+(\[\d+\])?", where) and where != "the policy" else ""
        raise SpecError(
            f"unknown key{'s' if len(unknown) > 1 else ''} in {where}: "
            + ", ".join(f"{key}{did_you_mean(key, allowed)}" for key in unknown),
            field=f"{section}.{unknown[0]}" if section else unknown[0],
        )


def _no_nul(value, where: str) -> None:
    """PostgreSQL text cannot hold NUL; refuse it up front with the field's name."""
    if isinstance(value, str) and "\x00" in value:
        raise SpecError(f"{where} contains a NUL character")
    if isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key, where)
            _no_nul(item, f"{key}" if where == "the policy" else f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _no_nul(item, f"{where}[{index}]")


def retention_parts(text, *, calendar_units: bool = True) -> tuple[int, str]:
    """(amount, unit) of a retention such as "90 days" → (90, "day"); "6 months" → (6, "month")
    (``calendar_units``: months and years allowed — a retention's, not a fixed duration's)."""
    if not isinstance(text, str):
        raise SpecError(f'retention must be a string like "90 days", got {text!r}')
    match = _RETENTION.fullmatch(text)
    if not match or (not calendar_units and match.group(2) in CALENDAR_MONTHS):
        units = "minutes, hours, days, weeks, months or years"
        if not calendar_units:
            units = "minutes, hours, days or weeks"
        raise SpecError(f'retention must look like "90 days" ({units}), got {text!r}')
    return int(match.group(1)), match.group(2)


def validate_zone(tz, where: str) -> str:
    if not isinstance(tz, str):
        raise SpecError(f'{where} must be an IANA name such as "Europe/Berlin", got {tz!r}')
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory
        raise SpecError(f"{where} {tz!r} is not a known IANA timezone") from None
    return tz


def parse_retention(text) -> timedelta:
    """A fixed duration ("30 days": minutes, hours, days or weeks), longer than zero."""
    amount, unit = retention_parts(text, calendar_units=False)
    if amount <= 0:
        raise SpecError(f"retention must be longer than zero, got {text!r}")
    return timedelta(seconds=amount * RETENTION_UNITS[unit])


def check_retention(text, *, expiry: bool) -> None:
    """A policy's retention: minutes to years, longer than zero — or zero when the timestamp is
    an expiry time (``timestamp_is_expiry``: a row may go as soon as it has passed)."""
    amount, _unit = retention_parts(text)
    if amount <= 0 and not expiry:
        raise SpecError(
            f"retention must be longer than zero, got {text!r}; when the timestamp is an "
            "expiry time (a row may go once it has passed), set timestamp_is_expiry = true"
        )


def validate_schedule(expr, tz) -> None:
    validate_zone(tz, "timezone")
    if not isinstance(expr, str) or len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise SpecError(f"schedule must be a five-field cron expression, got {expr!r}")
    try:  # a valid expression may still name no real date ("0 2 30 2 *": 30 February)
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterBadDateError, ValueError) as exc:
        raise SpecError(f"schedule {expr!r} never fires: no date matches it") from exc


@dataclass(frozen=True)
class KeepRule:
    column: str
    op: str
    value: object = None
    values: tuple = ()

    @classmethod
    def parse(cls, data, where: str) -> KeepRule:
        if not isinstance(data, dict):
            raise SpecError(f"{where} must be a table with column, op and value/values")
        _no_unknown(data, {"column", "op", "value", "values"}, where)
        column = _ident(data.get("column"), f"{where}.column")
        op = data.get("op")
        if isinstance(op, str):
            op = " ".join(op.lower().split())
        _choice(op, f"{where}.op", KEEP_OPERATORS)
        value, values = data.get("value"), data.get("values")
        if op in NULLARY_OPERATORS:
            if value is not None or values is not None:
                raise SpecError(f"{where}: {op!r} takes no value")
            return cls(column, op)
        if op in LIST_OPERATORS:
            if value is not None or not isinstance(values, list) or not values:
                raise SpecError(f"{where}: {op!r} needs a non-empty list in 'values'")
            if len(values) > MAX_KEEP_VALUES:
                raise SpecError(f"{where}: at most {MAX_KEEP_VALUES} values, got {len(values)}")
            for item in values:
                _scalar(item, f"{where}.values")
            return cls(column, op, None, tuple(values))
        if values is not None or value is None:
            raise SpecError(f"{where}: {op!r} needs a single 'value'")
        _scalar(value, f"{where}.value")
        return cls(column, op, value)

    def to_json(self) -> dict:
        out: dict = {"column": self.column, "op": self.op}
        if self.op in LIST_OPERATORS:
            out["values"] = list(self.values)
        elif self.op not in NULLARY_OPERATORS:
            out["value"] = self.value
        return out

    def describe(self) -> str:
        if self.op in NULLARY_OPERATORS:
            return f"{self.column} {self.op}"
        if self.op in LIST_OPERATORS:
            return f"{self.column} {self.op} ({', '.join(map(_literal, self.values))})"
        return f"{self.column} {self.op} {_literal(self.value)}"


def _scalar(value, where: str) -> None:
    """A keep value: a string, a number or a boolean (for a boolean column)."""
    if not isinstance(value, str | int | float):  # bool is an int
        raise SpecError(f"{where} must be a string, a number or a boolean, got {value!r}")


def _literal(value) -> str:
    """A keep value as a policy file writes it (``'x'``, ``5``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def check_period(text, where: str, *, expiry: bool) -> str:
    """An override's or a class's period: a retention (as ``check_retention`` reads it) or
    ``"forever"``; in its one written form."""
    if text == FOREVER:
        return FOREVER
    try:
        check_retention(text, expiry=expiry)
    except SpecError as exc:
        raise SpecError(f'{where}: {exc} (or "forever")') from None
    return " ".join(text.split())


@dataclass(frozen=True)
class Override:
    """``[[override]]``: another period (or ``"forever"``) for the rows of some tenants. Tenant
    values are kept as text, as holds keep them; the statements cast them to the tenant
    column's type, so the column's ``=`` decides (citext ignores case, integers leading
    zeros)."""

    tenants: tuple[str, ...]
    retention: str

    @classmethod
    def parse(cls, data, where: str, *, expiry: bool) -> Override:
        if not isinstance(data, dict):
            raise SpecError(f"{where} must be a table with tenant and retention")
        _no_unknown(data, {"tenant", "retention"}, where)
        raw = data.get("tenant")
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise SpecError(f"{where}.tenant must name at least one tenant")
        tenants = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int) or item == "":
                raise SpecError(
                    f'{where}.tenant must be a tenant value or a list of them ("acme", 42), '
                    f"got {item!r}"
                )
            tenants.append(str(item))
        if len(set(tenants)) != len(tenants):
            raise SpecError(f"{where}.tenant lists a tenant twice")
        if "retention" not in data:
            raise SpecError(f'{where} needs retention ("7 years" or "forever")')
        period = check_period(data["retention"], f"{where}.retention", expiry=expiry)
        return cls(tuple(tenants), period)

    def to_json(self) -> dict:
        return {"tenant": list(self.tenants), "retention": self.retention}

    def describe(self) -> str:
        return f"{', '.join(self.tenants)} → {self.retention}"


@dataclass(frozen=True)
class RetentionClass:
    """``[[class]]``: another period (or ``"forever"``) for the rows whose ``column`` equals
    ``value`` (compared as a keep rule's ``=`` compares); the other rows take the default."""

    column: str
    value: object
    retention: str

    @classmethod
    def parse(cls, data, where: str, *, expiry: bool) -> RetentionClass:
        if not isinstance(data, dict):
            raise SpecError(f"{where} must be a table with column, value and retention")
        _no_unknown(data, {"column", "value", "retention"}, where)
        column = _ident(data.get("column"), f"{where}.column")
        value = data.get("value")
        if value is None:
            raise SpecError(f"{where} needs a value")
        _scalar(value, f"{where}.value")
        if "retention" not in data:
            raise SpecError(f'{where} needs retention ("1 year" or "forever")')
        period = check_period(data["retention"], f"{where}.retention", expiry=expiry)
        return cls(column, value, period)

    def to_json(self) -> dict:
        return {"column": self.column, "value": self.value, "retention": self.retention}

    def describe(self) -> str:
        return f"{self.column} = {_literal(self.value)} → {self.retention}"


def _entries(data: dict, tenant, expiry: bool) -> tuple[tuple, tuple]:
    """The ``[[override]]`` and ``[[class]]`` entries of a policy file, checked."""
    raw_o, raw_c = data.get("override", []), data.get("class", [])
    if not isinstance(raw_o, list):
        raise SpecError("override must be a list of [[override]] tables")
    if not isinstance(raw_c, list):
        raise SpecError("class must be a list of [[class]] tables")
    overrides = tuple(
        Override.parse(item, f"override[{i}]", expiry=expiry) for i, item in enumerate(raw_o)
    )
    if overrides and not tenant:
        raise SpecError('[[override]] needs a tenant column (tenant = "...")')
    if overrides and isinstance(tenant, tuple):
        raise SpecError("[[override]] applies to a tenant of one column, not a list of columns")
    seen: dict[str, int] = {}
    for i, o in enumerate(overrides):
        for value in o.tenants:
            if value in seen:
                raise SpecError(f"tenant {value!r} is in override[{seen[value]}] and override[{i}]")
            seen[value] = i
    if len(seen) > MAX_OVERRIDE_TENANTS:
        raise SpecError(f"at most {MAX_OVERRIDE_TENANTS} overridden tenants, got {len(seen)}")
    if len(raw_c) > MAX_CLASSES:
        raise SpecError(f"at most {MAX_CLASSES} classes, got {len(raw_c)}")
    classes = tuple(
        RetentionClass.parse(item, f"class[{i}]", expiry=expiry) for i, item in enumerate(raw_c)
    )
    if len({c.column for c in classes}) > 1:
        raise SpecError(
            "every [[class]] names the same column (a row is in at most one class), got "
            + ", ".join(sorted({c.column for c in classes}))
        )
    values = [c.value for c in classes]
    if len({(type(v), v) for v in values}) != len(values):
        raise SpecError("two [[class]] entries name the same value")
    return overrides, classes


# -- the schema: every key of a policy file, declared once ----------------------------------
# Parsing (bounds, choices, defaults, unknown keys), the TOML writer, the version diff and the
# reference table in docs/policies.md are all derived from this table.


@dataclass(frozen=True)
class Field:
    """One key of a policy file. ``path`` is its TOML place ("chunk_size",
    "limits.policy_workers", "guard.probe_p95_ms"); ``attr`` the PolicySpec attribute
    (guard thresholds live in the ``guard`` mapping); ``kind`` how it is checked: "int" and
    "number" (``lo``..``hi``), "choice" (``choices``), "bool", or "special" (checked by name in
    ``PolicySpec.parse``). ``default`` is REQUIRED, or the value a missing key means.
    ``omitted_at_default``: a key added after versions were stored is left out of the stored
    document at its default, so the content hash of every older version does not change."""

    path: str
    attr: str
    kind: str
    default: object
    form: str
    meaning: str
    lo: float = 0
    hi: float = 0
    choices: tuple = ()
    shown_default: str | None = None  # the default as the reference table words it
    omitted_at_default: bool = False

    @property
    def section(self) -> str | None:
        return self.path.split(".")[0] if "." in self.path else None

    @property
    def key(self) -> str:
        return self.path.split(".")[-1]

    def value_of(self, spec: PolicySpec):
        if self.attr == "guard":
            return spec.guard[self.key]
        if self.attr == "table":
            return spec.qualified_table
        return getattr(spec, self.attr)


REQUIRED = object()
# An archiving policy's restore window when it names none (``[archive] restore_days``).
DEFAULT_RESTORE_DAYS = 30
_DURATION = '`"N minutes|hours|days|weeks"`'
_GUARD_MEANING = {
    "probe_p95_ms": "throttle above this probe p95",
    "lock_waits": "throttle above this many waiting locks",
    "replication_lag_s": "throttle above this replica lag",
    "dead_tuple_ratio": "throttle above this dead/live tuple ratio on the target",
    "connections_headroom": "keep this many connections free",
    "wal_mb_per_s": "throttle above this WAL rate",
    "critical_probe_p95_ms": "pause the policy above this",
    "critical_lock_waits": "pause the policy above this",
    "critical_replication_lag_s": "pause the policy above this",
}

FIELDS: tuple[Field, ...] = (
    Field("slug", "slug", "special", REQUIRED, "lowercase letters, digits, `-`; ≤ 80",
          "the policy's identity; a new slug creates a policy"),
    Field("name", "name", "special", "", "1–200 characters", "shown on the dashboard",
          shown_default="the slug"),
    Field("owner", "owner", "special", "", "≤ 150 characters",
          "team or person answerable for the policy", shown_default="the author"),
    Field("table", "table", "special", REQUIRED,
          '`"schema.table"` or `"table"` (schema `public`)', "a table or partitioned table"),
    Field("key", "key", "special", REQUIRED,
          'a column, or a list of columns (`["occurred_at", "id"]`), of any type with a btree '
          "ordering (integers, `uuid`, `text` in its collation, timestamps, `numeric`, …), led "
          "by a btree index on those columns (after the tenant column, if any)",
          "chunks are key intervals `[from, to)`; a list is compared as a row, "
          "`(a, b) >= (x, y)`"),
    Field("timestamp", "timestamp", "special", REQUIRED,
          "column of type `timestamptz`, `timestamp` or `date`; or `bigint`, `integer` or "
          "`numeric` with `timestamp_unit`",
          "a row is old when this is before the cutoff (a `date`: when its whole day is)"),
    Field("timestamp_unit", "timestamp_unit", "special", None, "`s`, `ms`, `us`; only for a "
          "`bigint`, `integer` or `numeric` timestamp column",
          "the column holds time since 1970-01-01 00:00 UTC (the Unix epoch) in seconds, "
          'milliseconds or microseconds (see "Epoch timestamps" below)',
          shown_default="none", omitted_at_default=True),
    Field("timestamp_is_expiry", "timestamp_is_expiry", "bool", False, "",
          "the timestamp is when a row expires, not when it was made: `retention` is the grace "
          'after it and may be `"0 days"` (see "Zero retention" below)',
          omitted_at_default=True),
    Field("tenant", "tenant", "special", None,
          "a column of any single-value type, or a list of up to 4 columns "
          '(`["entity_type", "entity_id"]`)',
          "chunks and ceilings are per tenant; holds can name a tenant (each part of a tenant "
          'of several columns: see "Tenants" below)', shown_default="none"),
    Field("null_tenant", "null_tenant", "choice", "keep", "",
          "rows whose tenant is NULL (any part of it): `keep` (never eligible) or `delete` "
          '(eligible like any other row; not with `chunking = "tenant"`)',
          choices=NULL_TENANT_CHOICES, omitted_at_default=True),
    Field("retention", "retention", "special", REQUIRED,
          '`"N minutes|hours|days|weeks|months|years"`, N ≥ 1 (N ≥ 0 with '
          "`timestamp_is_expiry`)",
          "cutoff = tick − retention: minutes and hours are elapsed time, days, weeks, months "
          'and years wall-clock time in `timezone` (see "Time" below)'),
    Field("schedule", "schedule", "special", REQUIRED, "five-field cron",
          "when runs are triggered"),
    Field("timezone", "timezone", "special", "UTC", "IANA name",
          "the clock the cron expression and day-based retention read"),
    Field("timestamp_zone", "timestamp_zone", "special", None,
          "IANA name; only for a `timestamp` or `date` column",
          'the zone whose wall-clock time the timestamp column holds (see "Time" below)',
          shown_default="`timezone`", omitted_at_default=True),
    Field("chunking", "chunking", "choice", "auto", "",
          "what chunks run along: `key` (key ranges across tenants, in the key's order), "
          "`tenant` (per-tenant key ranges on a `(tenant, key)` index), `timestamp` (ranges "
          "across tenants in timestamp order, on an index leading with the timestamp: for a "
          "random key on a table filled in time order), or `auto`: chosen from the table "
          "when a run is created (docs/engine.md, \"Chunk geometry\")",
          choices=("auto", "key", "tenant", "timestamp"), omitted_at_default=True),
    Field("chunk_size", "chunk_size", "int", 5000, "", "rows per chunk to start with "
          "(adapts toward `target_chunk_ms`)", lo=10, hi=200_000),
    Field("pace_rows_per_s", "pace_rows_per_s", "int", 0, "",
          "a ceiling on the policy's deletion rate; the preview's drain time uses it",
          lo=0, hi=100_000_000, shown_default="0 (none)"),
    Field("target_chunk_ms", "target_chunk_ms", "int", 300, "",
          "target duration of one chunk transaction", lo=10, hi=60_000),
    Field("limits.policy_workers", "policy_workers", "int", 2, "",
          "chunks of this policy in flight at once", lo=1, hi=64),
    Field("limits.tenant_workers", "tenant_workers", "int", 1, "1 – 64, ≤ `policy_workers`",
          "chunks of one tenant in flight at once", lo=1, hi=64),
    Field("slo.max_backlog_age", "max_backlog_age", "special", None, _DURATION,
          "how long the oldest eligible row may wait past its retention; shown on the "
          "overview (met / breached) and exported as `retention_backlog_slo_seconds`, which "
          "the `RetentionBacklogOverSLO` alert compares with "
          "`retention_backlog_overdue_seconds` (`deploy/prometheus/alerts.yml`)",
          shown_default="none", omitted_at_default=True),
    Field("timeouts.lock_ms", "lock_timeout_ms", "int", 2000, "",
          "`lock_timeout` of a chunk transaction", lo=10, hi=600_000),
    Field("timeouts.statement_ms", "statement_timeout_ms", "int", 10_000,
          "100 – 3600000, and see below", "`statement_timeout` of a chunk's DELETE",
          lo=100, hi=3_600_000),
    Field("guard.probe", "probe", "choice", "default", "", "the foreground latency probe",
          choices=("default", "none")),
    *(
        Field(f"guard.{name}", "guard", "number", default, "≥ 0", _GUARD_MEANING[name],
              lo=0, hi=10**9)
        for name, default in GUARD_DEFAULTS.items()
    ),
    Field("guard.fg_p99_ms", "fg_p99_ms", "special", None, "0.1 – 60000",
          "the foreground's latency limit as an absolute p99 in milliseconds, on `signal`; set, "
          "it replaces the relative limit (docs/guard.md, \"The limit\")",
          shown_default="`RETENTION_GUARD_FG_P99_MS` (none: the relative limit)",
          omitted_at_default=True),
    Field("guard.inflation", "inflation", "special", None, "1.01 – 100",
          "the relative limit: the foreground's p99 may reach max(inflation × its idle p99, "
          "idle + `margin_ms`) while the policy's chunks run",
          shown_default="`RETENTION_GUARD_INFLATION` (2.0)", omitted_at_default=True),
    Field("guard.margin_ms", "margin_ms", "special", None, "0 – 10000",
          "the relative limit's floor: at least this many milliseconds over the idle p99",
          shown_default="`RETENTION_GUARD_MARGIN_MS` (5)", omitted_at_default=True),
    Field("guard.signal", "signal", "special", None, "`probe`, `prometheus`, `both`",
          "which latency the limit judges: the built-in probe, the Prometheus query's value "
          "(the application's own p99, in seconds; needs `fg_p99_ms`), or both",
          shown_default="`RETENTION_GUARD_SIGNAL` (probe)", omitted_at_default=True),
    Field("guard.inflation_budget", "inflation_budget", "special", None, "1.01 – 100",
          "the older name of `inflation` (given both, they must agree)",
          shown_default="`inflation`", omitted_at_default=True),
    Field("guard.io_pressure", "io_pressure", "special", None, "0 – 1",
          "the controller backs off while the database host's I/O pressure (the share of time "
          "some task waited on I/O, `/proc/pressure/io`) is over this",
          shown_default="`RETENTION_GUARD_IO_PRESSURE` (0.3)", omitted_at_default=True),
    Field("guard.wal_fsync_ms", "wal_fsync_ms", "special", None, "0 – 60000",
          "the controller backs off while the server's WAL fsyncs take longer than this on "
          "average (`pg_stat_wal` / `pg_stat_io`, with `track_wal_io_timing`)",
          shown_default="`RETENTION_GUARD_WAL_FSYNC_MS` (20)", omitted_at_default=True),
    Field("guard.prometheus_url", "prometheus_url", "special", None,
          '`"http://host:9090"` (http or https)',
          "a Prometheus server whose query is an admission signal (docs/guard.md, "
          '"External health signals")', shown_default="`RETENTION_GUARD_PROMETHEUS_URL`",
          omitted_at_default=True),
    Field("guard.prometheus_query", "prometheus_query", "special", None, "PromQL, ≤ 2000 "
          "characters", "its highest value over `prometheus_threshold` throttles the policy's "
          "chunks", shown_default="`RETENTION_GUARD_PROMETHEUS_QUERY`", omitted_at_default=True),
    Field("guard.prometheus_threshold", "prometheus_threshold", "special", None, "a number",
          "the query's value above which chunks wait",
          shown_default="`RETENTION_GUARD_PROMETHEUS_THRESHOLD`", omitted_at_default=True),
    Field("guard.prometheus_timeout_ms", "prometheus_timeout_ms", "special", None,
          "10 – 60000", "how long one query may take",
          shown_default="`RETENTION_GUARD_PROMETHEUS_TIMEOUT_MS` (1000)", omitted_at_default=True),
    Field("guard.prometheus_grace_s", "prometheus_grace_s", "special", None, "0 – 86400",
          "how long Prometheus may give no answer before that counts as pressure",
          shown_default="`RETENTION_GUARD_PROMETHEUS_GRACE_S` (30)", omitted_at_default=True),
    Field("catch_up", "catch_up", "choice", "latest", "",
          "after missed ticks: one run for the latest, or none", choices=CATCH_UP_MODES),
    Field("overlap", "overlap", "choice", "wait", "",
          "a tick while the previous run is open waits for it or is skipped",
          choices=OVERLAP_MODES),
    Field("targets", "targets", "special", ("default",), 'list of target names and `"group:LABEL"`',
          "the databases it deletes from (`retention target list`): one run per target and "
          "period; a group's members when the run is triggered, one that joined later "
          "included", shown_default='`["default"]` (the control database)',
          omitted_at_default=True),
    Field("cascade_ack", "cascade_ack", "special", (), 'list of `"schema.table"`',
          "every table the `ON DELETE CASCADE` of its rows reaches, at any depth, that you "
          "accept: its rows go with theirs, counted, except where a policy of that table "
          "protects a row (see \"Cascades\" below)", shown_default="`[]`"),
    Field("blast_radius", "blast_radius", "number", 3.0, "",
          "the run engine holds a run for confirmation when it plans more than this × the "
          "preview's eligible rows", lo=1.0, hi=1000.0, shown_default="3.0"),
    Field("max_passes", "max_passes", "int", 3, "",
          "verification passes before a run needs attention", lo=1, hi=20),
    Field("vacuum", "vacuum", "choice", "recommend", "",
          "after a drained run: `recommend` notes `VACUUM (ANALYZE)` with the dead tuples the "
          "run left; `run` schedules it on the cleanup cluster once the drain commits (the "
          "workers' role must be allowed to vacuum the table, docs/security.md); `off` only "
          "records the dead tuples (docs/guard.md, \"After a run\")", choices=VACUUM_MODES),
    Field("partition_action", "partition_action", "choice", "drop", "",
          "a partitioned table's partition that is wholly past the cutoff, with nothing kept "
          "or held, is detached and dropped, or left detached (docs/policies.md, "
          "\"Partitioned tables\")", choices=PARTITION_ACTIONS, omitted_at_default=True),
    Field("detached_keep", "detached_keep", "special", None,
          _DURATION + ", N ≥ 1; only with `partition_action = \"detach\"`",
          "how long a detached partition's table is kept: the reconciler drops it once its "
          "detach is older (docs/policies.md, \"Partitioned tables\")",
          shown_default="kept for good", omitted_at_default=True),
    Field("rollout", "rollout", "choice", "full", "",
          "how far the version's runs go: `count` runs plan and count what a full run would "
          "delete (per tenant, per month, kept, held) and delete nothing; `slice` runs delete "
          "only rows older than the cutoff minus `slice`, one chunk at a time; `full` runs "
          'delete everything eligible (see "Rolling out a policy" below)',
          choices=ROLLOUT_STAGES, omitted_at_default=True),
    Field("slice", "slice", "special", None,
          '`"N minutes|hours|days|weeks|months|years"`, N ≥ 1; only with `rollout = "slice"`',
          "a slice run deletes only rows older than its cutoff minus this (the slice bound)",
          shown_default="none", omitted_at_default=True),
    Field("archive.to", "archive_to", "special", None,
          '`"file:///ABSOLUTE/DIR"` or `"target:NAME/schema.table"`',
          "archive before deleting: each chunk's rows are written to a Parquet file under this "
          "directory (a writable directory on the workers' hosts), or inserted into that table "
          "of the registered target NAME, read back and verified before its DELETE commits "
          "(see \"Archiving before deleting\" below)",
          shown_default="no archive", omitted_at_default=True),
    Field("archive.restore_days", "archive_restore_days", "special", None, "1 – 36500",
          "how long after a run its archived rows may be restored (`retention restore`); only "
          "with `[archive] to`", shown_default=f"{DEFAULT_RESTORE_DAYS}",
          omitted_at_default=True),
    Field("archive.keep_years", "archive_keep_years", "special", None, "1 – 100",
          "how long the archive keeps a run's objects: the reconciler removes them once the "
          "run's cutoff is this many years old, each named with its digest in an audit record, "
          "none under an open legal hold; only with `[archive] to = \"file:///DIR\"`",
          shown_default="kept for good", omitted_at_default=True),
    Field("keep", "keep", "special", (), "see below", "rows that are never deleted",
          shown_default="none"),
    Field("override", "overrides", "special", (),
          '`{ tenant = "V" | ["V1", "V2"], retention = "PERIOD" | "forever" }`; a tenant of one '
          "column", "another period for these tenants' rows (see \"Per-tenant periods, classes "
          'and floors" below)', shown_default="none", omitted_at_default=True),
    Field("class", "classes", "special", (),
          '`{ column = "state", value = "failed", retention = "PERIOD" | "forever" }`, one '
          "column for all classes", "another period for the rows whose column equals the value "
          '(see "Per-tenant periods, classes and floors" below)', shown_default="none",
          omitted_at_default=True),
)  # fmt: skip
ENTRY_PATHS = ("keep", "override", "class")  # the [[…]] lists of a policy file
FIELD_BY_PATH = {f.path: f for f in FIELDS}
SECTIONS = {f.section for f in FIELDS if f.section}
TOP_KEYS = {f.path for f in FIELDS if not f.section} | SECTIONS


def _keys_of(section: str) -> set[str]:
    return {f.key for f in FIELDS if f.section == section}


def _check(f: Field, value):
    """A simple (int/number/choice) field's value, checked and in canonical form."""
    if f.kind == "int":
        return _int(value, f.path, int(f.lo), int(f.hi))
    if f.kind == "number":
        return _number(value, f.path, f.lo, f.hi, f.default)
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise SpecError(f"{f.path} must be true or false, got {value!r}")
        return value
    return _choice(value, f.path, f.choices)


def _reference_cell(f: Field) -> tuple[str, str, str, str, str]:
    key = f"`[{f.section}] {f.key}`" if f.section else f"`{f.path}`"
    if f.path in ENTRY_PATHS:
        key = f"`[[{f.path}]]`"
    required = "yes" if f.default is REQUIRED else ""
    if f.shown_default is not None:
        default = f.shown_default
    elif f.default is REQUIRED:
        default = ""
    elif isinstance(f.default, bool):
        default = f"`{str(f.default).lower()}`"
    elif isinstance(f.default, str):
        default = f'`"{f.default}"`' if f.kind == "choice" else f"`{f.default}`"
    else:
        default = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
    if f.form:
        form = f.form
    elif f.kind == "choice":
        form = ", ".join(f"`{c}`" for c in f.choices)
    elif f.kind == "bool":
        form = "`true`, `false`"
    else:
        form = f"{f.lo:g} – {f.hi:g}" if f.kind == "number" else f"{int(f.lo)} – {int(f.hi)}"
    return key, required, default, form, f.meaning


def reference_table() -> str:
    """The policy-file reference of docs/policies.md, derived from ``FIELDS``."""
    rows = ["| key | required | default | range / form | meaning |", "|---|---|---|---|---|"]
    rows += [
        "|" + "|".join(f" {c} " if c else " " for c in _reference_cell(f)) + "|" for f in FIELDS
    ]
    return "\n".join(rows) + "\n"


def _guard_extras(section: dict) -> dict:
    """The ``[guard]`` keys that default to an instance setting (None when absent)."""
    out: dict = {}
    budget = section.get("inflation_budget")
    if budget is not None:
        out["inflation_budget"] = float(_number(budget, "guard.inflation_budget", 1.01, 100.0))
    inflation = section.get("inflation")
    if inflation is not None:
        out["inflation"] = float(_number(inflation, "guard.inflation", 1.01, 100.0))
        if budget is not None and float(budget) != out["inflation"]:
            raise SpecError(
                "guard.inflation and guard.inflation_budget are one setting (inflation_budget is"
                f" its older name), got {inflation} and {budget}: set only guard.inflation"
            )
    fg_p99 = section.get("fg_p99_ms")
    if fg_p99 is not None:
        out["fg_p99_ms"] = float(_number(fg_p99, "guard.fg_p99_ms", 0.1, 60_000.0))
    margin = section.get("margin_ms")
    if margin is not None:
        out["margin_ms"] = float(_number(margin, "guard.margin_ms", 0.0, 10_000.0))
    signal = section.get("signal")
    if signal is not None:
        out["signal"] = _choice(signal, "guard.signal", ("probe", "prometheus", "both"))
        if signal != "probe" and fg_p99 is None:
            raise SpecError(
                f'guard.signal = "{signal}" judges the application\'s own p99 from Prometheus,'
                " which has no idle baseline the guard measures: state its limit as"
                " guard.fg_p99_ms"
            )
    pressure = section.get("io_pressure")
    if pressure is not None:
        out["io_pressure"] = float(_number(pressure, "guard.io_pressure", 0.0, 1.0))
    fsync = section.get("wal_fsync_ms")
    if fsync is not None:
        out["wal_fsync_ms"] = float(_number(fsync, "guard.wal_fsync_ms", 0.0, 60_000.0))
    url = section.get("prometheus_url")
    if url is not None:
        if (
            not isinstance(url, str)
            or not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url)
            or len(url) > 500
        ):
            raise SpecError(
                'guard.prometheus_url must be an http or https URL like "http://prometheus:9090",'
                f" got {url!r}"
            )
        out["prometheus_url"] = url.rstrip("/")
    query = section.get("prometheus_query")
    if query is not None:
        if not isinstance(query, str) or not query.strip() or len(query) > 2000:
            raise SpecError(
                "guard.prometheus_query must be a PromQL expression of 1–2000 characters"
            )
        out["prometheus_query"] = query.strip()
    threshold = section.get("prometheus_threshold")
    if threshold is not None:
        out["prometheus_threshold"] = float(
            _number(threshold, "guard.prometheus_threshold", -1e18, 1e18)
        )
    timeout = section.get("prometheus_timeout_ms")
    if timeout is not None:
        out["prometheus_timeout_ms"] = _int(timeout, "guard.prometheus_timeout_ms", 10, 60_000)
    grace = section.get("prometheus_grace_s")
    if grace is not None:
        out["prometheus_grace_s"] = _int(grace, "guard.prometheus_grace_s", 0, 86_400)
    return out


def archive_path(url: str) -> str:
    """The absolute directory of an ``[archive] to`` URL (``file:///srv/archive/events``)."""
    prefix = "file://"
    if not isinstance(url, str) or not url.startswith(prefix):
        raise SpecError(
            'archive.to must be a URL like "file:///srv/archive/events" or'
            f' "target:NAME/schema.table", got {url!r}'
        )
    path = url[len(prefix) :]
    if not path.startswith("/") or "\\" in path:
        raise SpecError(
            f'archive.to must name an absolute directory ("file:///srv/archive/events"), got {url!r}'
        )
    parts = path.split("/")
    if any(part in (".", "..") for part in parts) or len(path) > 1000:
        raise SpecError(f"archive.to must be a plain absolute path without . or .., got {url!r}")
    return path.rstrip("/") or "/"


ARCHIVE_TARGET_PREFIX = "target:"
_ARCHIVE_TARGET = re.compile(
    r"^target:(?P<target>[a-z][a-z0-9_-]{0,62})/(?:(?P<schema>[^./\s\"]{1,63})\.)?"
    r"(?P<table>[^./\s\"]{1,63})$"
)


@dataclass(frozen=True)
class ArchiveTable:
    """An ``[archive] to = "target:NAME/schema.table"``: a table in another registered
    database that a chunk's rows are inserted into before its DELETE commits."""

    target: str
    schema: str
    table: str

    @property
    def url(self) -> str:
        return f"{ARCHIVE_TARGET_PREFIX}{self.target}/{self.schema}.{self.table}"

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"


def archive_table(url: str) -> ArchiveTable:
    """The destination table of a ``target:NAME/schema.table`` URL (schema ``public`` when
    only the table is named); SpecError with one line otherwise."""
    match = _ARCHIVE_TARGET.match(url) if isinstance(url, str) else None
    if match is None:
        raise SpecError(
            'archive.to must be "target:NAME/schema.table" (a registered target, a table there)'
            f", got {url!r}"
        )
    return ArchiveTable(match["target"], match["schema"] or "public", match["table"])


def _archive_url(to) -> str:
    """An ``[archive] to`` in its stored form: ``file:///DIR`` or ``target:NAME/schema.table``."""
    if isinstance(to, str) and to.startswith(ARCHIVE_TARGET_PREFIX):
        return archive_table(to).url
    return "file://" + archive_path(to)


def _archive(section: dict) -> dict:
    """The ``[archive]`` keys: a destination URL and a restore window only with it."""
    out: dict = {}
    to = section.get("to")
    if to is not None:
        out["archive_to"] = _archive_url(to)
    days = section.get("restore_days")
    if days is not None:
        if to is None:
            raise SpecError(
                'archive.restore_days applies only with archive.to = "file:///DIR" or'
                ' "target:NAME/schema.table"'
            )
        out["archive_restore_days"] = _int(days, "archive.restore_days", 1, 36500)
    years = section.get("keep_years")
    if years is not None:
        if to is None or out["archive_to"].startswith(ARCHIVE_TARGET_PREFIX):
            raise SpecError('archive.keep_years applies only with archive.to = "file:///DIR"')
        out["archive_keep_years"] = _int(years, "archive.keep_years", 1, 100)
    return out


_TARGET_NAME = re.compile(r"^(group:)?[a-z][a-z0-9_-]{0,62}$")


def _targets(value) -> tuple[str, ...]:
    """``targets``: a non-empty list of target names and ``"group:LABEL"``, each once."""
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and _TARGET_NAME.match(v) for v in value)
    ):
        raise SpecError(
            'targets must be a non-empty list of target names or "group:LABEL" (lowercase'
            ' letters, digits, "-" and "_"), e.g. targets = ["payments"]'
        )
    if len(set(value)) != len(value):
        raise SpecError("targets names a target or group twice")
    return tuple(value)


@dataclass(frozen=True)
class PolicySpec:
    slug: str
    name: str
    schema: str
    table: str
    key: str | tuple[str, ...]  # a tuple: a composite key, compared as a row
    timestamp: str
    tenant: str | tuple[str, ...] | None  # a tuple: a tenant of several columns
    retention: str
    schedule: str
    timezone: str
    chunk_size: int = 5000
    keep: tuple[KeepRule, ...] = ()
    policy_workers: int = 2
    tenant_workers: int = 1
    guard: dict = field(default_factory=lambda: dict(GUARD_DEFAULTS))
    probe: str = "default"
    catch_up: str = "latest"
    overlap: str = "wait"
    cascade_ack: tuple[str, ...] = ()
    # the targets it deletes from (names, "group:LABEL"); left out of the stored JSON at its
    # default, so the content hash of a version from before targets does not change
    targets: tuple[str, ...] = ("default",)
    lock_timeout_ms: int = 2000
    statement_timeout_ms: int = 10000
    target_chunk_ms: int = 300
    blast_radius: float = 3.0
    max_passes: int = 3
    vacuum: str = "recommend"
    pace_rows_per_s: int = 0
    owner: str = ""
    # The zone whose wall-clock time a `timestamp without time zone` (or `date`) column
    # holds; None: the policy's timezone. Left out of the stored JSON when None, so the
    # content hash of a version written before this field existed does not change.
    timestamp_zone: str | None = None
    # [slo] max_backlog_age: how long the oldest eligible row may wait past its retention
    # (exported as retention_backlog_slo_seconds; deploy/prometheus/alerts.yml). None: no
    # SLO, and left out of the stored JSON like timestamp_zone.
    max_backlog_age: str | None = None
    # What a run does with a partition it may drop whole; left out of the stored JSON when
    # "drop" (the default), so the content hash of an older version does not change.
    partition_action: str = "drop"
    # With partition_action "detach": how long a detached partition's table is kept before
    # the reconciler drops it (runs.engine.partitions.drop_kept_detached). None: kept for good, and
    # left out of the stored JSON, so the content hash of an older version does not change.
    detached_keep: str | None = None
    # What chunks run along (retention.geometry); "auto" is left out of the stored JSON, so
    # the content hash of a version written before this field existed does not change.
    chunking: str = "auto"
    # An epoch timestamp column's unit ("s", "ms", "us"); None: a timestamp, timestamptz or
    # date column. Like the fields below, left out of the stored JSON at its default.
    timestamp_unit: str | None = None
    # The timestamp is when a row expires: retention is the grace after it (may be zero).
    timestamp_is_expiry: bool = False
    # Rows whose tenant is NULL: "keep" (never eligible) or "delete" (eligible).
    null_tenant: str = "keep"
    # [guard] keys added with the latency controller and the Prometheus signal; None: the
    # instance's setting (RETENTION_GUARD_*). Left out of the stored JSON when None.
    inflation_budget: float | None = None
    # the foreground's limit as the team states it (docs/guard.md, "The limit") and the I/O
    # signals' thresholds; None: the instance's setting. Left out of the stored JSON when None.
    fg_p99_ms: float | None = None
    inflation: float | None = None
    margin_ms: float | None = None
    signal: str | None = None
    io_pressure: float | None = None
    wal_fsync_ms: float | None = None
    prometheus_url: str | None = None
    prometheus_query: str | None = None
    prometheus_threshold: float | None = None
    prometheus_timeout_ms: int | None = None
    prometheus_grace_s: int | None = None
    # The rollout stage of the version's runs (ROLLOUT_STAGES) and, for "slice", how far
    # before the cutoff deletion stops; both left out of the stored JSON at their defaults.
    rollout: str = "full"
    slice: str | None = None
    # [archive]: the directory each chunk's rows are written to before its DELETE (a
    # ``file://`` URL of an absolute path) and the restore window in days; both left out of
    # the stored JSON when None, so no older version's content hash changes.
    archive_to: str | None = None
    archive_restore_days: int | None = None
    # [archive] keep_years: the archive's own retention, in years after a run's cutoff (None:
    # kept for good); left out of the stored JSON when None.
    archive_keep_years: int | None = None
    # [[override]] and [[class]]: other periods for some tenants' rows and for some kinds of
    # row; left out of the stored JSON when there are none.
    overrides: tuple[Override, ...] = ()
    classes: tuple[RetentionClass, ...] = ()

    @classmethod
    def parse(cls, data: dict) -> PolicySpec:
        """Build a spec from a TOML-shaped mapping; raise SpecError naming the first problem."""
        if not isinstance(data, dict):
            raise SpecError("a policy must be a table of keys")
        _no_nul(data, "the policy")
        _no_unknown(data, TOP_KEYS, "the policy")
        for required in (f.path for f in FIELDS if f.default is REQUIRED):
            if required not in data:
                raise SpecError(f"missing required key: {required}")
        sections = {}
        for section in sorted(SECTIONS):
            sections[section] = data.get(section, {})
            if not isinstance(sections[section], dict):
                raise SpecError(f"{section} must be a table")
            _no_unknown(sections[section], _keys_of(section), section)
        slug = data["slug"]
        if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
            raise SpecError(f"slug must be lowercase letters, digits and dashes, got {slug!r}")
        table = data["table"]
        if not isinstance(table, str):
            raise SpecError(f'table must be a string like "public.events", got {table!r}')
        parts = table.split(".")
        if len(parts) == 1:
            schema, name = "public", parts[0]
        elif len(parts) == 2:
            schema, name = parts
        else:
            raise SpecError(f'table must be "schema.table" or "table", got {table!r}')
        _ident(schema, "table (schema)")
        _ident(name, "table")
        key = _key(data["key"])
        ts = _ident(data["timestamp"], "timestamp")
        tenant = data.get("tenant")
        if tenant is not None:
            tenant = _key(tenant, "tenant", MAX_TENANT_COLUMNS)
        timestamp_unit = data.get("timestamp_unit")
        if timestamp_unit is not None:
            _choice(timestamp_unit, "timestamp_unit", TIMESTAMP_UNITS)
        retention = data["retention"]
        retention_parts(retention)  # its amount is checked with timestamp_is_expiry below
        timezone_name = data.get("timezone", "UTC")
        validate_schedule(data["schedule"], timezone_name)
        timestamp_zone = data.get("timestamp_zone")
        if timestamp_zone is not None:
            validate_zone(timestamp_zone, "timestamp_zone")
        name_text = data.get("name", slug)
        if not isinstance(name_text, str) or not name_text.strip() or len(name_text) > 200:
            raise SpecError("name must be a non-empty string of at most 200 characters")
        owner = data.get("owner", "")
        if not isinstance(owner, str) or len(owner) > 150:
            raise SpecError("owner must be a string of at most 150 characters")
        keep_raw = data.get("keep", [])
        if not isinstance(keep_raw, list):
            raise SpecError("keep must be a list of [[keep]] tables")
        if len(keep_raw) > MAX_KEEP_RULES:
            raise SpecError(f"at most {MAX_KEEP_RULES} keep rules, got {len(keep_raw)}")
        keep = tuple(KeepRule.parse(item, f"keep[{i}]") for i, item in enumerate(keep_raw))
        max_backlog_age = sections["slo"].get("max_backlog_age")
        if max_backlog_age is not None:
            try:
                parse_retention(max_backlog_age)
            except SpecError as exc:
                raise SpecError(
                    "slo.max_backlog_age: " + str(exc).replace("retention ", "", 1)
                ) from None
            max_backlog_age = " ".join(max_backlog_age.split())
        detached_keep = data.get("detached_keep")
        if detached_keep is not None:
            try:
                parse_retention(detached_keep)
            except SpecError as exc:
                raise SpecError("detached_keep: " + str(exc).replace("retention ", "", 1)) from None
            detached_keep = " ".join(detached_keep.split())
        slice_text = data.get("slice")
        if slice_text is not None:
            try:
                amount, _unit = retention_parts(slice_text)
            except SpecError as exc:
                raise SpecError("slice: " + str(exc).replace("retention ", "", 1)) from None
            if amount <= 0:
                raise SpecError(f"slice must be longer than zero, got {slice_text!r}")
            slice_text = " ".join(slice_text.split())
        cascade = data.get("cascade_ack", [])
        if not isinstance(cascade, list) or not all(isinstance(c, str) for c in cascade):
            raise SpecError('cascade_ack must be a list of "schema.table" names')
        targets = _targets(data.get("targets", ["default"]))
        guard_extra = _guard_extras(sections["guard"])
        archive_extra = _archive(sections["archive"])
        simple, guard = {}, dict(GUARD_DEFAULTS)
        for f in FIELDS:
            if f.kind == "special":
                continue
            where = sections[f.section] if f.section else data
            value = _check(f, where.get(f.key, f.default))
            if f.attr == "guard":
                guard[f.key] = value
            else:
                simple[f.attr] = value
        spec = cls(
            slug=slug,
            name=name_text.strip(),
            schema=schema,
            table=name,
            key=key,
            timestamp=ts,
            tenant=tenant,
            retention=" ".join(retention.split()),
            schedule=" ".join(data["schedule"].split()),
            timezone=timezone_name,
            keep=keep,
            guard=guard,
            cascade_ack=tuple(sorted(cascade)),
            targets=targets,
            owner=owner.strip(),
            timestamp_zone=timestamp_zone,
            max_backlog_age=max_backlog_age,
            detached_keep=detached_keep,
            timestamp_unit=timestamp_unit,
            slice=slice_text,
            **guard_extra,
            **archive_extra,
            **simple,
        )
        check_retention(spec.retention, expiry=spec.timestamp_is_expiry)
        overrides, classes = _entries(data, spec.tenant, spec.timestamp_is_expiry)
        if overrides or classes:
            spec = replace(spec, overrides=overrides, classes=classes)
        if spec.null_tenant != "keep" and not spec.tenant:
            raise SpecError(
                f"null_tenant applies to a policy with a tenant column, got null_tenant = "
                f'"{spec.null_tenant}" without tenant'
            )
        if spec.null_tenant == "delete" and spec.chunking == "tenant":
            raise SpecError(
                'null_tenant = "delete" cannot go with chunking = "tenant": rows without a '
                'tenant belong to no tenant\'s chunks; use chunking = "key", "timestamp" '
                'or "auto"'
            )
        if spec.detached_keep is not None and spec.partition_action != "detach":
            raise SpecError(
                'detached_keep applies only with partition_action = "detach" (a dropped'
                f' partition leaves no table to keep), got partition_action = "{spec.partition_action}"'
            )
        if spec.rollout == "slice" and spec.slice is None:
            raise SpecError('rollout = "slice" needs slice, e.g. slice = "30 days"')
        if spec.slice is not None and spec.rollout != "slice":
            raise SpecError(
                f'slice applies only with rollout = "slice", got rollout = "{spec.rollout}"'
            )
        if spec.tenant_workers > spec.policy_workers:
            raise SpecError("limits.tenant_workers cannot exceed limits.policy_workers")
        return spec

    # -- storage -----------------------------------------------------------
    def to_json(self) -> dict:
        data = asdict(self)
        data["keep"] = [rule.to_json() for rule in self.keep]
        data["overrides"] = [o.to_json() for o in self.overrides]
        data["classes"] = [c.to_json() for c in self.classes]
        data["cascade_ack"] = list(self.cascade_ack)
        data["targets"] = list(self.targets)
        for name in ("key", "tenant"):
            if isinstance(data[name], tuple):
                data[name] = list(data[name])
        for f in FIELDS:
            value = data[f.attr]
            if f.omitted_at_default and (
                value in (f.default, [])
                or (tuple(value) if isinstance(value, list) else value) == f.default
            ):
                del data[f.attr]
        return data

    @classmethod
    def from_json(cls, data: dict) -> PolicySpec:
        """The spec of a stored version, values as stored: ``to_json()`` gives back the stored
        document, so its content hash verifies even for a version stored before numbers were
        normalized to floats (a stored ``"probe_p95_ms": 25`` keeps its hash)."""
        data = dict(data)
        data["keep"] = tuple(KeepRule.parse(item, "keep") for item in data.get("keep", []))
        data["cascade_ack"] = tuple(data.get("cascade_ack", ()))
        expiry = bool(data.get("timestamp_is_expiry"))
        data["overrides"] = tuple(
            Override.parse(item, "override", expiry=expiry) for item in data.get("overrides", [])
        )
        data["classes"] = tuple(
            RetentionClass.parse(item, "class", expiry=expiry) for item in data.get("classes", [])
        )

        data["targets"] = tuple(data.get("targets", ("default",)))
        for name in ("key", "tenant"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        data["guard"] = {**GUARD_DEFAULTS, **data.get("guard", {})}
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_toml(self) -> str:
        """The spec as a policy file (written by tomli-w from ``FIELDS``);
        ``load_toml(spec.to_toml())`` gives back an equal spec."""
        doc: dict = {}
        for f in FIELDS:
            value = f.value_of(self)
            if f.path in ENTRY_PATHS or value is None or value == "":
                continue
            if f.path == "pace_rows_per_s" and not value:
                continue
            if f.path in ("rollout", "targets") and value == f.default:
                continue
            if isinstance(value, tuple):
                value = list(value)
            (doc.setdefault(f.section, {}) if f.section else doc)[f.key] = value
        if self.keep:
            doc["keep"] = [rule.to_json() for rule in self.keep]
        if self.overrides:
            doc["override"] = [
                {"tenant": o.tenants[0] if len(o.tenants) == 1 else list(o.tenants),
                 "retention": o.retention}
                for o in self.overrides
            ]  # fmt: skip
        if self.classes:
            doc["class"] = [c.to_json() for c in self.classes]
        return tomli_w.dumps(doc)

    def content_hash(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    # -- derived ----------------------------------------------------------
    @property
    def max_backlog_age_s(self) -> float | None:
        """The backlog SLO in seconds (None when the policy sets none)."""
        if not self.max_backlog_age:
            return None
        return parse_retention(self.max_backlog_age).total_seconds()

    @property
    def archive_dir(self) -> str | None:
        """The archive's directory (an absolute path), or None when the policy does not archive
        to files."""
        if not self.archive_to or self.archive_to.startswith(ARCHIVE_TARGET_PREFIX):
            return None
        return archive_path(self.archive_to)

    @property
    def archive_table(self) -> ArchiveTable | None:
        """The archive's table in another registered database, or None when the policy does
        not archive to a database."""
        if not self.archive_to or not self.archive_to.startswith(ARCHIVE_TARGET_PREFIX):
            return None
        return archive_table(self.archive_to)

    @property
    def restore_days(self) -> int:
        """Days after a run's rows were archived during which they may be restored."""
        return self.archive_restore_days or DEFAULT_RESTORE_DAYS

    @property
    def detached_keep_delta(self) -> timedelta | None:
        """How long a detached partition's table is kept (None: for good)."""
        return parse_retention(self.detached_keep) if self.detached_keep else None

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The key's columns, in order (one for a plain key)."""
        return self.key if isinstance(self.key, tuple) else (self.key,)

    @property
    def tenant_columns(self) -> tuple[str, ...]:
        """The tenant's columns, in order (one for a plain tenant; none without a tenant)."""
        if not self.tenant:
            return ()
        return self.tenant if isinstance(self.tenant, tuple) else (self.tenant,)

    @property
    def tenant_label(self) -> str:
        """The tenant as people read it: ``tenant_id`` or ``(entity_type, entity_id)``."""
        cols = self.tenant_columns
        return cols[0] if len(cols) == 1 else f"({', '.join(cols)})"

    @property
    def key_label(self) -> str:
        """The key as people read it: ``id`` or ``(occurred_at, id)``."""
        cols = self.key_columns
        return cols[0] if len(cols) == 1 else f"({', '.join(cols)})"

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def column_zone(self) -> str:
        """The zone a `timestamp without time zone` or `date` column's values are read in."""
        return self.timestamp_zone or self.timezone

    def cutoff_for(self, tick: datetime) -> datetime:
        """The cutoff of the run for ``tick``, decided on the unit written: minutes and hours
        are elapsed time (``tick - 24 hours`` is always 86,400 s earlier); days, weeks, months
        and years are wall-clock time in the policy's timezone (``tick - 1 day`` is the same
        local time the day before, 23 or 25 hours earlier across a DST change; ``tick - 1
        month`` the same local time and day of the month before, or that month's last day
        when it is shorter — as PostgreSQL subtracts ``interval '1 month'``). A zero
        retention is the tick itself."""
        return self._before(tick, self.retention)

    def slice_bound(self, cutoff: datetime) -> datetime | None:
        """The bound of a slice run with ``cutoff``: rows older than it are deleted (the
        cutoff minus ``slice``, read like the retention); None for a count or full run."""
        if self.rollout != "slice" or not self.slice:
            return None
        return self._before(cutoff, self.slice)

    @property
    def periods(self) -> tuple[str, ...]:
        """Every period the version deletes by: the default, then each override's and class's
        (``"forever"`` included), each once."""
        found = [self.retention, *(o.retention for o in self.overrides)]
        found += [c.retention for c in self.classes]
        return tuple(dict.fromkeys(found))

    def period_cutoff(self, cutoff: datetime, period: str) -> datetime | None:
        """The cutoff of ``period`` in the run whose default cutoff (or slice bound) is
        ``cutoff``: the tick the cutoff was taken at, minus the period, read like the
        retention (``cutoff_for``); None for ``"forever"``. The tick is the cutoff plus the
        default retention; where the subtraction shortened a month (31 March − 1 month = 28
        February) that sum is the earlier day, so a period's cutoff is never later than the
        true tick's — a period never deletes a row younger than itself."""
        if period == FOREVER:
            return None
        if period == self.retention:
            return cutoff
        return self._before(self._after(cutoff, self.retention), period)

    def _after(self, instant: datetime, text: str) -> datetime:
        """``instant`` plus the duration ``text``: the inverse of ``_before`` (months that
        lack the day become their last day)."""
        amount, unit = retention_parts(text)
        utc = instant.astimezone(zoneinfo.ZoneInfo("UTC"))
        if amount == 0:
            return utc
        if unit in WALL_CLOCK_UNITS:
            tz = zoneinfo.ZoneInfo(self.timezone)
            local = instant.astimezone(tz).replace(tzinfo=None)
            if unit in CALENDAR_MONTHS:
                local = months_before(local, -amount * CALENDAR_MONTHS[unit])
            else:
                local += timedelta(seconds=amount * RETENTION_UNITS[unit])
            return _localize(local, tz)
        return utc + timedelta(seconds=amount * RETENTION_UNITS[unit])

    def _before(self, tick: datetime, text: str) -> datetime:
        """``tick`` minus the duration ``text``, as ``cutoff_for`` reads a retention."""
        amount, unit = retention_parts(text)
        utc = tick.astimezone(zoneinfo.ZoneInfo("UTC"))
        if amount == 0:
            return utc
        if unit in WALL_CLOCK_UNITS:
            tz = zoneinfo.ZoneInfo(self.timezone)
            local = tick.astimezone(tz).replace(tzinfo=None)
            if unit in CALENDAR_MONTHS:
                local = months_before(local, amount * CALENDAR_MONTHS[unit])
            else:
                local -= timedelta(seconds=amount * RETENTION_UNITS[unit])
            return _localize(local, tz)
        # in UTC: arithmetic on a datetime whose tzinfo has DST is wall-clock arithmetic
        return utc - timedelta(seconds=amount * RETENTION_UNITS[unit])


def load_toml(text: str) -> PolicySpec:
    """Parse a policy file's text (TOML) into a spec; SpecError names the first problem."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError("the policy file is empty")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise SpecError(f"the policy file is {size} bytes, more than {MAX_POLICY_BYTES}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"malformed TOML: {exc}") from None
    try:
        return PolicySpec.parse(data)
    except SpecError as exc:
        raise located(exc, text) from None


# -- the form editor: the common fields of a version, edited and written back as a policy file --

# and the keep rules; an empty optional field (``slice``) is left out of the file
FORM_FIELDS = ("name", "retention", "schedule", "chunk_size", "rollout", "slice")
FORM_OPTIONAL = ("slice",)
FORM_KEEP_ROWS = 3  # empty keep-rule rows the form offers beyond the version's own
_FORM_INT = re.compile(r"^\s*[+-]?\d+\s*$")


def toml_literal(value) -> str:
    """``value`` as it is written in a policy file (``"disputed"``, ``5``, ``["a", "b"]``)."""
    return tomli_w.dumps({"v": list(value) if isinstance(value, tuple) else value})[4:].strip()


def form_value(path: str, text: str):
    """A form field's text as the policy file would hold it: an integer field's digits as an
    integer, anything else as the text typed (``PolicySpec.parse`` then gives the error a
    policy file with that value gets)."""
    if FIELD_BY_PATH[path].kind == "int" and _FORM_INT.match(text):
        return int(text)
    return text


def form_keep_rule(n: int, column: str, op: str, value: str) -> dict | None:
    """Keep rule ``n`` (from 1) of the form: its value written as in a policy file
    (``"text"``, a number, or a list for ``in``/``not in``); None for an empty row."""
    column, op, value = column.strip(), op.strip(), value.strip()
    if not (column or op or value):
        return None
    rule: dict = {"column": column, "op": op}
    if not value:
        return rule
    if "\n" in value or "\r" in value:
        raise SpecError(f"keep rule {n}: the value must be on one line")
    try:
        parsed = tomllib.loads(f"v = {value}")
    except tomllib.TOMLDecodeError:
        raise SpecError(
            f"keep rule {n}: value {value} is not a TOML value (text goes in quotes: "
            f"{toml_literal(value)})"
        ) from None
    if set(parsed) != {"v"}:
        raise SpecError(f"keep rule {n}: value {value} is not one TOML value")
    rule["values" if isinstance(parsed["v"], list) else "value"] = parsed["v"]
    return rule


def edited_toml(base: PolicySpec, fields: dict, keep: list[dict]) -> str:
    """The policy file of ``base`` with the form's fields (``FORM_FIELDS``) and keep rules
    written over it, by the writer ``to_toml`` uses. Not validated here: the result goes
    through ``load_toml`` like any uploaded file.

    A name left as it was that spells out the old retention ("… older than 90 days") follows
    a changed retention ("… older than 60 days"), so the title never contradicts the version
    it belongs to; a name the form changed is taken as written."""
    doc = tomllib.loads(base.to_toml())
    for path, text in fields.items():
        if path not in FORM_FIELDS:
            raise SpecError(f"the form does not edit {path!r}")
        if path in FORM_OPTIONAL and not text.strip():
            doc.pop(path, None)
            continue
        doc[path] = form_value(path, text)
    retention = str(doc.get("retention", base.retention)).strip()
    if (
        doc.get("name", base.name) == base.name
        and retention != base.retention
        and base.retention in base.name
    ):
        doc["name"] = base.name.replace(base.retention, retention)
    doc.pop("keep", None)
    if keep:
        doc["keep"] = keep
    return tomli_w.dumps(doc)


# Ticks a period comparison is read at: every day a month may end on, and the days after, in
# leap and common years (2023–2028), at midnight UTC.
_REFERENCE_TICKS = tuple(
    datetime(year, month, day, tzinfo=zoneinfo.ZoneInfo("UTC"))
    for year in range(2023, 2029)
    for month in range(1, 13)
    for day in (1, 2, 28, 29, 30, 31)
    if day <= calendar.monthrange(year, month)[1]
)


def period_covers(longer: str, shorter: str) -> bool:
    """``longer`` keeps every row ``shorter`` keeps, at any tick: ``tick − longer`` is never
    after ``tick − shorter`` (read in UTC; ``"forever"`` covers everything and only itself).
    "1 year" covers "365 days" (a year is 365 or 366 days) but not "366 days"."""
    if longer == FOREVER:
        return True
    if shorter == FOREVER:
        return False
    spec = _UTC_CLOCK
    return all(spec._before(t, longer) <= spec._before(t, shorter) for t in _REFERENCE_TICKS)


def months_before(local: datetime, months: int) -> datetime:
    """The same wall-clock time ``months`` calendar months earlier; a day the earlier month
    lacks becomes its last day (31 March − 1 month = 28 or 29 February)."""
    index = local.year * 12 + local.month - 1 - months
    year, month = divmod(index, 12)
    day = min(local.day, calendar.monthrange(year, month + 1)[1])
    return local.replace(year=year, month=month + 1, day=day)


def _localize(naive: datetime, tz: zoneinfo.ZoneInfo) -> datetime:
    """Attach tz to a wall-clock time the way PostgreSQL reads a ``timestamp`` in a zone
    (``timestamp AT TIME ZONE``): a time skipped by a change of the clock is read with the
    UTC offset in force just before the change (Lord Howe's 02:15 in its 02:00–02:30 gap is
    02:15+10:30, that is 02:45+11:00), a time that happens twice with the offset in force just
    after it (New York's repeated 01:30 is 01:30-05:00). docs/policies.md, "Time"."""
    earlier = naive.replace(tzinfo=tz, fold=0)
    later = naive.replace(tzinfo=tz, fold=1)
    if earlier.utcoffset() == later.utcoffset():
        return earlier.astimezone(zoneinfo.ZoneInfo("UTC"))
    exists = earlier.astimezone(zoneinfo.ZoneInfo("UTC")).astimezone(tz).replace(tzinfo=None)
    # zoneinfo reads a skipped time with fold 0 by the offset before the change, and a
    # repeated one with fold 1 by the offset after it
    chosen = later if exists == naive else earlier
    return chosen.astimezone(zoneinfo.ZoneInfo("UTC"))


# a spec whose clock is UTC, to read periods on (``period_covers``)
_UTC_CLOCK = PolicySpec(
    slug="x", name="x", schema="x", table="x", key="x", timestamp="x", tenant=None,
    retention="1 day", schedule="0 0 * * *", timezone="UTC",
)  # fmt: skip
