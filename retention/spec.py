"""The normalized specification of a policy version, and its parser.

One parser serves the TOML files, the forms and the stored JSON, so every
path into a policy gets the same checks. It checks shape only; whether the
table and columns exist is ``retention.introspect``'s job.
"""

from __future__ import annotations

import hashlib
import json
import re
import zoneinfo
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from croniter import CroniterBadDateError, croniter

KEEP_OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "is null", "is not null")
NULLARY_OPERATORS = ("is null", "is not null")
LIST_OPERATORS = ("in", "not in")
RETENTION_UNITS = {"minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
CATCH_UP_MODES = ("latest", "none")
OVERLAP_MODES = ("wait", "skip")
VACUUM_MODES = ("recommend", "run", "off")
# Bounds on a policy file, so no input makes the parser, the preview or the DELETE unbounded.
MAX_POLICY_BYTES = 64 * 1024
MAX_KEEP_RULES = 32
MAX_KEEP_VALUES = 1000  # per "in" / "not in" list

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")
_RETENTION = re.compile(r"^\s*(\d+)\s*(minute|hour|day|week)s?\s*$")

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
    """A policy specification is malformed; the message names the field."""


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
        raise SpecError(
            f"unknown key{'s' if len(unknown) > 1 else ''} in {where}: {', '.join(unknown)}"
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


def retention_parts(text) -> tuple[int, str]:
    """(amount, unit) of a retention such as "90 days" → (90, "day")."""
    if not isinstance(text, str):
        raise SpecError(f'retention must be a string like "90 days", got {text!r}')
    match = _RETENTION.fullmatch(text)
    if not match:
        raise SpecError(
            f'retention must look like "90 days" (minutes, hours, days or weeks), got {text!r}'
        )
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
    amount, unit = retention_parts(text)
    if amount <= 0:
        raise SpecError(f"retention must be longer than zero, got {text!r}")
    return timedelta(seconds=amount * RETENTION_UNITS[unit])


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
            return f"{self.column} {self.op} ({', '.join(map(repr, self.values))})"
        return f"{self.column} {self.op} {self.value!r}"


def _scalar(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"{where} must be a string or a number, got {value!r}")


@dataclass(frozen=True)
class PolicySpec:
    slug: str
    name: str
    schema: str
    table: str
    key: str
    timestamp: str
    tenant: str | None
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

    TOP_KEYS = {
        "slug",
        "name",
        "table",
        "key",
        "timestamp",
        "tenant",
        "retention",
        "schedule",
        "timezone",
        "chunk_size",
        "keep",
        "limits",
        "guard",
        "catch_up",
        "overlap",
        "cascade_ack",
        "timeouts",
        "target_chunk_ms",
        "blast_radius",
        "max_passes",
        "vacuum",
        "owner",
        "pace_rows_per_s",
        "timestamp_zone",
        "slo",
    }

    @classmethod
    def parse(cls, data: dict) -> PolicySpec:
        """Build a spec from a TOML-shaped mapping; raise SpecError naming the first problem."""
        if not isinstance(data, dict):
            raise SpecError("a policy must be a table of keys")
        _no_nul(data, "the policy")
        _no_unknown(data, cls.TOP_KEYS, "the policy")
        for required in ("slug", "table", "key", "timestamp", "retention", "schedule"):
            if required not in data:
                raise SpecError(f"missing required key: {required}")
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
        key = _ident(data["key"], "key")
        ts = _ident(data["timestamp"], "timestamp")
        tenant = data.get("tenant")
        if tenant is not None:
            _ident(tenant, "tenant")
        retention = data["retention"]
        parse_retention(retention)
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
        limits = data.get("limits", {})
        if not isinstance(limits, dict):
            raise SpecError("limits must be a table")
        _no_unknown(limits, {"policy_workers", "tenant_workers"}, "limits")
        guard_raw = data.get("guard", {})
        if not isinstance(guard_raw, dict):
            raise SpecError("guard must be a table")
        _no_unknown(guard_raw, set(GUARD_DEFAULTS) | {"probe"}, "guard")
        guard = dict(GUARD_DEFAULTS)
        for gkey, gval in guard_raw.items():
            if gkey == "probe":
                continue
            guard[gkey] = _number(gval, f"guard.{gkey}", 0, 10**9, GUARD_DEFAULTS[gkey])
        probe = guard_raw.get("probe", "default")
        _choice(probe, "guard.probe", ("default", "none"))
        timeouts = data.get("timeouts", {})
        if not isinstance(timeouts, dict):
            raise SpecError("timeouts must be a table")
        _no_unknown(timeouts, {"lock_ms", "statement_ms"}, "timeouts")
        slo = data.get("slo", {})
        if not isinstance(slo, dict):
            raise SpecError("slo must be a table")
        _no_unknown(slo, {"max_backlog_age"}, "slo")
        max_backlog_age = slo.get("max_backlog_age")
        if max_backlog_age is not None:
            try:
                parse_retention(max_backlog_age)
            except SpecError as exc:
                raise SpecError(
                    "slo.max_backlog_age: " + str(exc).replace("retention ", "", 1)
                ) from None
            max_backlog_age = " ".join(max_backlog_age.split())
        cascade = data.get("cascade_ack", [])
        if not isinstance(cascade, list) or not all(isinstance(c, str) for c in cascade):
            raise SpecError('cascade_ack must be a list of "schema.table" names')
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
            chunk_size=_int(data.get("chunk_size", 5000), "chunk_size", 10, 200_000),
            keep=keep,
            policy_workers=_int(limits.get("policy_workers", 2), "limits.policy_workers", 1, 64),
            tenant_workers=_int(limits.get("tenant_workers", 1), "limits.tenant_workers", 1, 64),
            guard=guard,
            probe=probe,
            catch_up=_choice(data.get("catch_up", "latest"), "catch_up", CATCH_UP_MODES),
            overlap=_choice(data.get("overlap", "wait"), "overlap", OVERLAP_MODES),
            cascade_ack=tuple(sorted(cascade)),
            lock_timeout_ms=_int(timeouts.get("lock_ms", 2000), "timeouts.lock_ms", 10, 600_000),
            statement_timeout_ms=_int(
                timeouts.get("statement_ms", 10_000), "timeouts.statement_ms", 100, 3_600_000
            ),
            target_chunk_ms=_int(data.get("target_chunk_ms", 300), "target_chunk_ms", 10, 60_000),
            blast_radius=_number(data.get("blast_radius", 3.0), "blast_radius", 1.0, 1000.0),
            max_passes=_int(data.get("max_passes", 3), "max_passes", 1, 20),
            vacuum=_choice(data.get("vacuum", "recommend"), "vacuum", VACUUM_MODES),
            pace_rows_per_s=_int(data.get("pace_rows_per_s", 0), "pace_rows_per_s", 0, 100_000_000),
            owner=owner.strip(),
            timestamp_zone=timestamp_zone,
            max_backlog_age=max_backlog_age,
        )
        if spec.tenant_workers > spec.policy_workers:
            raise SpecError("limits.tenant_workers cannot exceed limits.policy_workers")
        return spec

    # -- storage -----------------------------------------------------------
    def to_json(self) -> dict:
        data = asdict(self)
        data["keep"] = [rule.to_json() for rule in self.keep]
        data["cascade_ack"] = list(self.cascade_ack)
        if data["timestamp_zone"] is None:
            del data["timestamp_zone"]
        if data["max_backlog_age"] is None:
            del data["max_backlog_age"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> PolicySpec:
        """The spec of a stored version, values as stored: ``to_json()`` gives back the stored
        document, so its content hash verifies even for a version stored before numbers were
        normalized to floats (a stored ``"probe_p95_ms": 25`` keeps its hash)."""
        data = dict(data)
        data["keep"] = tuple(KeepRule.parse(item, "keep") for item in data.get("keep", []))
        data["cascade_ack"] = tuple(data.get("cascade_ack", ()))
        data["guard"] = {**GUARD_DEFAULTS, **data.get("guard", {})}
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_toml(self) -> str:
        """The spec as a policy file; ``load_toml(spec.to_toml())`` gives back an equal spec."""

        def value(v) -> str:
            if isinstance(v, str):
                return json.dumps(v, ensure_ascii=False)  # JSON escapes are TOML escapes
            if isinstance(v, list | tuple):
                return "[" + ", ".join(value(item) for item in v) + "]"
            return repr(v)

        lines = [
            f"slug = {value(self.slug)}",
            f"name = {value(self.name)}",
        ]
        if self.owner:
            lines.append(f"owner = {value(self.owner)}")
        lines += [
            f"table = {value(self.qualified_table)}",
            f"key = {value(self.key)}",
            f"timestamp = {value(self.timestamp)}",
        ]
        if self.tenant:
            lines.append(f"tenant = {value(self.tenant)}")
        lines += [
            f"retention = {value(self.retention)}",
            f"schedule = {value(self.schedule)}",
            f"timezone = {value(self.timezone)}",
            *([f"timestamp_zone = {value(self.timestamp_zone)}"] if self.timestamp_zone else []),
            f"chunk_size = {self.chunk_size}",
            f"catch_up = {value(self.catch_up)}",
            f"overlap = {value(self.overlap)}",
            f"cascade_ack = {value(list(self.cascade_ack))}",
            f"target_chunk_ms = {self.target_chunk_ms}",
            f"blast_radius = {value(self.blast_radius)}",
            f"max_passes = {self.max_passes}",
            f"vacuum = {value(self.vacuum)}",
        ]
        if self.pace_rows_per_s:
            lines.append(f"pace_rows_per_s = {self.pace_rows_per_s}")
        lines += [
            "",
            "[limits]",
            f"policy_workers = {self.policy_workers}",
            f"tenant_workers = {self.tenant_workers}",
            "",
            "[timeouts]",
            f"lock_ms = {self.lock_timeout_ms}",
            f"statement_ms = {self.statement_timeout_ms}",
            "",
            "[guard]",
            f"probe = {value(self.probe)}",
        ]
        lines += [f"{name} = {value(self.guard[name])}" for name in sorted(self.guard)]
        if self.max_backlog_age:
            lines += ["", "[slo]", f"max_backlog_age = {value(self.max_backlog_age)}"]
        for rule in self.keep:
            lines += ["", "[[keep]]"]
            lines += [f"{k} = {value(v)}" for k, v in rule.to_json().items()]
        return "\n".join(lines) + "\n"

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
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def retention_delta(self) -> timedelta:
        return parse_retention(self.retention)

    @property
    def column_zone(self) -> str:
        """The zone a `timestamp without time zone` or `date` column's values are read in."""
        return self.timestamp_zone or self.timezone

    def cutoff_for(self, tick: datetime) -> datetime:
        """The cutoff of the run for ``tick``, decided on the unit written: minutes and hours
        are elapsed time (``tick - 24 hours`` is always 86,400 s earlier); days and weeks are
        wall-clock time in the policy's timezone (``tick - 1 day`` is the same local time the
        day before, 23 or 25 hours earlier across a DST change)."""
        delta = self.retention_delta
        if retention_parts(self.retention)[1] in ("day", "week"):
            tz = zoneinfo.ZoneInfo(self.timezone)
            local = tick.astimezone(tz).replace(tzinfo=None) - delta
            return _localize(local, tz)
        # in UTC: arithmetic on a datetime whose tzinfo has DST is wall-clock arithmetic
        return tick.astimezone(zoneinfo.ZoneInfo("UTC")) - delta


def load_toml(text: str) -> PolicySpec:
    """Parse a policy file's text (TOML) into a spec; SpecError names the first problem."""
    import tomllib

    if not isinstance(text, str) or not text.strip():
        raise SpecError("the policy file is empty")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise SpecError(f"the policy file is {size} bytes, more than {MAX_POLICY_BYTES}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"malformed TOML: {exc}") from None
    return PolicySpec.parse(data)


def _localize(naive: datetime, tz: zoneinfo.ZoneInfo) -> datetime:
    """Attach tz to a wall-clock time; a time skipped by DST moves forward, an ambiguous one
    takes the earlier instant (fold=0) — deterministic either way."""
    aware = naive.replace(tzinfo=tz)
    roundtrip = aware.astimezone(zoneinfo.ZoneInfo("UTC")).astimezone(tz).replace(tzinfo=None)
    if roundtrip != naive:  # nonexistent local time
        aware = (naive + timedelta(hours=1)).replace(tzinfo=tz)
    return aware.astimezone(zoneinfo.ZoneInfo("UTC"))
