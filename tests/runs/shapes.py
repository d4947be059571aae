"""Target tables of many shapes, built in real PostgreSQL, and one engine run over each.

A ``Shape`` names a table's column types, its key layout, NULLs, ages around the cutoff,
the policy's timezone and retention, the tick, and the legal holds placed (with their
tenants written in other forms than the column's). ``run_shape`` builds the table and its
shadow copy, applies and approves the policy with the real action functions, places the
holds, triggers the run, drains it in-process and returns what the invariant checker
(``runs.evidence.invariants.check_run``) finds against the shadow copy.

``defects(shape)`` says which of the engine defects of issue 11 a shape can expose, so
the matrix marks those shapes expected-to-fail (strictly) while a defect is open, and
the generator of the long mode leaves them out.
"""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db import DatabaseError, connection, transaction

from retention import actions as retention_actions
from runs.actions import trigger_run
from runs.engine import worker
from runs.evidence.invariants import HoldScope, Shadow, check_run
from runs.models import AuditRecord, Run
from tests.factories import approved_policy

# Engine defects not yet fixed on main: the six of issue 11 by number, and the ones this
# matrix found (100+). A shape that can expose one is an expected failure (strict: it
# turns red the day the fix lands, and the number goes).
OPEN_DEFECTS: set[int] = set()
DEFECT_REASONS = {
    # 1 (fixed): a hold's tenant was compared with the column's text form, not in its type
    # 102 (fixed): a hold's tenant was stripped of surrounding spaces before it was compared
    # 101 (fixed): the cutoff of an hour or minute retention for a tick given in a DST zone
    # was computed on that zone's wall clock (datetime arithmetic in the tick's tzinfo)
}


def reason(defect: int) -> str:
    return DEFECT_REASONS.get(defect, f"issue 11 defect {defect}")


TABLE = "rr_shape"
SHADOW = f"{TABLE}_shadow"
COLLATION = "rr_shape_ci"  # ICU, case-insensitive, nondeterministic
KEY_COLLATION = "rr_shape_de"  # ICU, German: orders ä with a and Z after z, unlike "C"

KEY_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}
TENANT_SQL = {
    "integer": "integer",
    "bigint": "bigint",
    "text": "text",
    "varchar_c": 'varchar(40) COLLATE "C"',
    "varchar_ci": f"varchar(40) COLLATE {COLLATION}",
    "citext": "citext",
    "uuid": "uuid",
}
UUIDS = [
    uuid.UUID("3f2504e0-4f89-11d3-9a0c-0305e82c3301"),
    uuid.UUID("a1b2c3d4-0000-4000-8000-00000000000a"),
    uuid.UUID("ffffffff-ffff-4fff-bfff-fffffffffff0"),
]
# Values stored in the tenant column, per type (distinct by the type's own ``=`` unless
# noted: 'acme' and 'ACME' are one tenant in citext and in the case-insensitive collation).
TENANT_POOLS = {
    "integer": [1, 2, 7, 10, 42],
    "bigint": [1, 7, 5_000_000_000, -3],
    "text": ["acme", "Acme", " acme", "globex", "007"],
    "varchar_c": ["acme", "Acme", "globex", "Zeta", "älpha"],
    "varchar_ci": ["acme", "ACME", "globex", "Globex", "initech"],
    "citext": ["acme", "ACME", "globex", "Initech"],
    "uuid": [str(u) for u in UUIDS],
}
# Key types beyond the integers: the key column's SQL type (text in a non-C collation).
OTHER_KEY_SQL = {
    "uuid4": "uuid",
    "uuid7": "uuid",
    "text": f"text COLLATE {KEY_COLLATION}",
    "timestamptz": "timestamptz",
    "numeric": "numeric",
    "text_ci": f"text COLLATE {COLLATION}",  # 'Acme-1' and 'acme-1' are one key
    "text_odd": 'text COLLATE "C"',  # '', spaces, quotes, backslashes, 900-character keys
    "bytea": "bytea",
    "bigint_domain": "rr_shape_id",  # a domain over bigint
    "enum": "rr_shape_grade180",  # ordered by its declaration, not its labels' text
    "varchar": "varchar(60)",  # ordered by text's operator class (a binary coercion)
    "float8": "float8",  # NaN, ±Infinity, -0 (equal to 0), denormals, 0.1
    "interval": "interval",  # '1 day' and '24 hours' are one key
}
ENUM_LABELS = [f"{c}{i}" for i in range(60) for c in "zmA"]  # more than a shape has rows
assert OTHER_KEY_SQL["enum"].endswith(str(len(ENUM_LABELS)))  # a new list makes a new type
ICU_KEYS = {"text", "text_ci"}
NON_UNIQUE_KEYS = {"text_ci", "float8", "interval"}  # values their type's = calls equal
ZONES = ("UTC", "Europe/Berlin", "America/New_York")
# Both DST days of 2026 in each zone (UTC has none: two ordinary days).
DST_DAYS = {
    "UTC": ["2026-03-29", "2026-10-25"],
    "Europe/Berlin": ["2026-03-29", "2026-10-25"],
    "America/New_York": ["2026-03-08", "2026-11-01"],
}
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


# Epoch timestamp columns: "<type>-<unit>" (``Shape.ts_type``), e.g. "bigint-ms".
EPOCH_SQL = {"bigint": "bigint", "integer": "integer", "numeric": "numeric"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}
# The first part of a tenant of two columns (``Shape.tenant_parts``): what kind of entity.
TENANT_KINDS = ["group", "project", "user"]


def epoch_of(ts_type: str) -> tuple[str, str] | None:
    """(SQL type, unit) of an epoch timestamp column, or None."""
    if "-" not in ts_type:
        return None
    kind, unit = ts_type.split("-")
    return EPOCH_SQL[kind], unit


@dataclasses.dataclass(frozen=True)
class Hold:
    """A hold as an operator writes it. ``tenant`` is an index into the tenant pool plus a
    written form, or a raw string (a tuple: each part of a tenant of several columns);
    ``scope`` is the shape's policy or all policies."""

    tenant: str | tuple[str, ...] | None = None
    key_from: int | None = None
    key_to: int | None = None
    scope: str = "policy"  # policy | all


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str = "shape"
    seed: int = 0
    tenant_type: str | None = "integer"
    key_type: str = "bigint"  # an integer type (KEY_RANGES) or one of OTHER_KEY_SQL
    # a composite key: "" (just id), "tenant" (tenant, id) or "at" (at, id)
    composite: str = ""
    key_layout: str = "dense"  # dense | negative | sparse | top | bottom | dup | heavy
    correlated: bool = True  # keys ascend with time
    # timestamptz | timestamp | domain (over timestamptz) | date | an epoch column "<type>-<unit>"
    # (bigint-s, bigint-ms, bigint-us, integer-s, numeric-s, numeric-ms, numeric-us)
    ts_type: str = "timestamptz"
    timezone: str = "UTC"
    retention: str = "20 days"
    tick: datetime = NOW
    rows: int = 120
    age: str = "mixed"  # mixed | none_eligible | all_eligible
    null_tenant: bool = False
    null_ts: bool = False
    null_key: bool = False
    null_keep: bool = False
    keep: bool = True
    holds: tuple[Hold, ...] = ()
    chunk_size: int = 20
    chunking: str = "auto"  # the policy's chunking (auto, key, tenant, timestamp)
    ts_index: str = "at"  # the timestamp's index: "at", "at-key" (at, key…) or "none"
    ts_ties: bool = False  # timestamps on the half hour: many rows share one, across chunks
    # the geometry the run must take ("" : any); a shape made for one geometry says so
    expect_chunking: str = ""
    tenant_parts: int = 1  # 2: a tenant of two columns, (tenant_kind text, tenant)
    null_tenant_policy: str = "keep"  # the policy's null_tenant

    def describe(self) -> str:
        fields = dataclasses.asdict(self)
        return ", ".join(f"{k}={v!r}" for k, v in fields.items() if k != "name")


# -- expected cutoff (for placing rows near it; the checker recomputes it in SQL) --------


def _retention(text: str) -> tuple[int, str]:
    number, unit = text.split()
    return int(number), unit.rstrip("s")


def true_cutoff(shape: Shape) -> datetime:
    number, unit = _retention(shape.retention)
    if unit in {"month", "year"}:  # the same wall-clock time, the day clamped to the month's
        zone = ZoneInfo(shape.timezone)
        local = shape.tick.astimezone(zone).replace(tzinfo=None)
        months = local.year * 12 + local.month - 1 - number * (12 if unit == "year" else 1)
        year, month = divmod(months, 12)
        last = (datetime(year + (month + 1) // 12, (month + 1) % 12 + 1, 1) - timedelta(days=1)).day
        local = local.replace(year=year, month=month + 1, day=min(local.day, last))
        return local.replace(tzinfo=zone).astimezone(UTC)
    if unit in {"day", "week"}:
        zone = ZoneInfo(shape.timezone)
        local = shape.tick.astimezone(zone).replace(tzinfo=None) - timedelta(
            days=number * (7 if unit == "week" else 1)
        )
        return local.replace(tzinfo=zone).astimezone(UTC)
    return shape.tick.astimezone(UTC) - timedelta(seconds=number * (3600 if unit == "hour" else 60))


def wall_clock_cutoff(shape: Shape) -> datetime:
    """What an engine that treats whole-day hours as days computes."""
    number, unit = _retention(shape.retention)
    if unit in {"month", "year"}:
        return true_cutoff(shape)
    seconds = number * {"minute": 60, "hour": 3600, "day": 86400, "week": 604800}[unit]
    if seconds % 86400:
        return true_cutoff(shape)
    zone = ZoneInfo(shape.timezone)
    local = shape.tick.astimezone(zone).replace(tzinfo=None) - timedelta(seconds=seconds)
    return local.replace(tzinfo=zone).astimezone(UTC)


# -- which defects a shape can expose ---------------------------------------------------


def canonical_text(tenant_type: str, value) -> str:
    return str(value)


def typed_equal(tenant_type: str, stored, written: str) -> bool | None:
    """``stored = CAST(written AS type)`` as PostgreSQL decides it (None: does not cast).
    Only to tag shapes with the defects they can expose; the checker asks PostgreSQL."""
    w = written
    try:
        if tenant_type in {"integer", "bigint"}:
            return int(w.strip()) == stored  # int input skips surrounding spaces
        if tenant_type == "uuid":
            return uuid.UUID(w) == uuid.UUID(stored)  # uuid input does not
    except ValueError:
        return None
    if tenant_type in {"citext", "varchar_ci"}:
        return w.lower() == stored.lower()
    return w == stored


def _hold_defects(shape: Shape, hold: Hold, rows) -> set[int]:
    """The defects a hold can expose on the shape's old, not kept rows: 1 when comparing the
    stripped value with ``tenant::text`` (the engine before the fix) decides differently from
    the column type's ``=``; 102 when comparing the stripped value in the column's type does."""
    found: set[int] = set()
    if hold.tenant is None or shape.tenant_parts > 1 or isinstance(hold.tenant, tuple):
        return found
    if shape.tenant_type is None:
        return {1} if any(r.old and not r.kept for r in rows) else found
    stored = hold.tenant.strip()
    for r in rows:
        if r.tenant is None or not r.old or r.kept:
            continue
        typed = bool(typed_equal(shape.tenant_type, r.tenant, hold.tenant))
        text = canonical_text(shape.tenant_type, r.tenant)
        # ``row.tenant::text`` keeps the column's collation: a case-insensitive one still
        # compares case-insensitively
        as_text = (
            stored.lower() == text.lower() if shape.tenant_type == "varchar_ci" else stored == text
        )
        if typed != as_text:
            found.add(1)
        if typed != bool(typed_equal(shape.tenant_type, r.tenant, stored)):
            found.add(102)
    return found


def defects(shape: Shape, rows=None) -> set[int]:
    rows = rows if rows is not None else generate_rows(shape)
    found: set[int] = set()
    for hold in shape.holds:
        found |= _hold_defects(shape, hold, rows)
    if 1 in OPEN_DEFECTS:  # the engine on main still compares as text: 102 cannot show yet
        found.discard(102)
    top = KEY_RANGES.get(shape.key_type, (0, None))[1]
    if shape.key_type == "bigint" and any(r.key == top and r.old and not r.kept for r in rows):
        found.add(4)
    if true_cutoff(shape) != wall_clock_cutoff(shape):
        found.add(6)
    elapsed = _retention(shape.retention)[1] in {"minute", "hour"}
    if elapsed and shape.tick.tzinfo is not UTC:
        number, unit = _retention(shape.retention)
        seconds = number * (3600 if unit == "hour" else 60)
        if (shape.tick - timedelta(seconds=seconds)).astimezone(UTC) != true_cutoff(shape):
            found.add(101)
    if shape.ts_type == "timestamp" and shape.timezone != "UTC":
        offset = true_cutoff(shape).astimezone(ZoneInfo(shape.timezone)).utcoffset()
        cutoff = true_cutoff(shape)
        if any(
            r.at is not None and min(cutoff, cutoff - offset) <= r.at < max(cutoff, cutoff - offset)
            for r in rows
        ):
            found.add(6)
    return found


# -- rows -------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    key: int | None
    tenant: object
    at: datetime | None  # the instant; a naive column stores its wall time in the zone
    status: str | None
    old: bool = False
    kept: bool = False


def _other_keys(shape: Shape, rng: random.Random, n: int) -> list:
    """Distinct keys of a non-integer type, ascending in the order rows are inserted where
    the type's values follow time (uuid v7, timestamps), random where they do not."""
    if shape.key_type == "uuid4":
        return [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(n)]
    if shape.key_type == "uuid7":
        base_ms = int(NOW.timestamp() * 1000) - 40 * 86_400_000
        out = []
        for i in range(n):
            ms = base_ms + i * 1000 + rng.randint(0, 999)
            value = (ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64)
            value |= (0b10 << 62) | rng.getrandbits(62)
            out.append(uuid.UUID(int=value))
        return out
    if shape.key_type == "text":
        heads = ["a", "Ä", "b", "ö", "Z", "z", "ß", "é", "E", "ñ"]
        return [f"{rng.choice(heads)}{rng.choice(heads)}-{i:05d}" for i in range(n)]
    if shape.key_type == "timestamptz":
        start = NOW - timedelta(days=60)
        picks = sorted(rng.sample(range(60 * 86_400_000_000), n))
        return [start + timedelta(microseconds=m) for m in picks]
    if shape.key_type == "numeric":
        from decimal import Decimal

        return sorted({Decimal(rng.randint(-(10**30), 10**30)) / 1000 for _ in range(n)})
    if shape.key_type == "text_ci":  # distinct in "C", equal by twos under the collation
        return [f"{'aA'[i % 2]}cme-{i // 2:05d}{' ' * (i % 3 == 0)}" for i in range(n)]
    if shape.key_type == "text_odd":
        odd = ["", " ", "  ", "a", "a ", "'", "''", "\\", "\\x00", '"', "NULL", "[1]", "é", "\t"]
        out = odd[:n] + [f"{rng.choice(odd)}{'z' * rng.randint(0, 900)}-{i}" for i in range(n)]
        return out[:n]
    if shape.key_type == "bigint_domain":
        return [rng.randint(1, 50) * 1000 + i for i in range(n)]
    if shape.key_type == "enum":
        return sorted(rng.sample(ENUM_LABELS, min(n, len(ENUM_LABELS))), key=ENUM_LABELS.index)
    if shape.key_type == "varchar":
        return [f"ORD-{rng.randint(0, 99):02d}-{i:05d}" for i in range(n)]
    if shape.key_type == "float8":
        fixed = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 5e-324, 0.1, 1e308]
        return fixed[:n] + [rng.uniform(-1e6, 1e6) for _ in range(max(0, n - len(fixed)))]
    if shape.key_type == "interval":
        return [
            timedelta(hours=rng.randint(0, 400), microseconds=rng.randint(0, 10)) for _ in range(n)
        ]
    if shape.key_type == "bytea":
        fixed = [b"", b"\x00", b"\x00\x00", b"\xff", b"\\x"]
        return fixed[:n] + [rng.randbytes(rng.randint(1, 40)) for _ in range(max(0, n - 5))]
    raise ValueError(shape.key_type)


def _keys(shape: Shape, rng: random.Random, n: int) -> list:
    if shape.key_type in OTHER_KEY_SQL:
        keys = _other_keys(shape, rng, n)
        if shape.key_layout == "dup":  # a non-unique key: each value about three times
            keys = [rng.choice(keys[: max(1, n // 3)]) for _ in range(n)]
        if shape.key_layout == "heavy" and keys:  # one value on half the rows
            keys = [keys[0] if rng.random() < 0.5 else k for k in keys]
        return keys
    lo, hi = KEY_RANGES[shape.key_type]
    n = min(n, hi - lo)
    if shape.key_layout == "dense":
        start = rng.randint(1, 1000)
        return [start + i for i in range(n)]
    if shape.key_layout == "negative":
        start = -rng.randint(n, 3 * n)
        return [start + 2 * i for i in range(n)]
    if shape.key_layout == "sparse":
        keys: set[int] = set()
        while len(keys) < n:
            keys.add(rng.randint(lo, hi))
        return sorted(keys)
    if shape.key_layout == "top":
        return [hi - n + 1 + i for i in range(n)]
    if shape.key_layout == "bottom":
        return [lo + i for i in range(n)]
    if shape.key_layout == "dup":
        return sorted(rng.randint(1, max(1, n // 3)) for _ in range(n))
    if shape.key_layout == "heavy":  # one value on half the rows, far more than a chunk
        return sorted(500 if rng.random() < 0.5 else rng.randint(1, 1000) for _ in range(n))
    raise ValueError(shape.key_layout)


def generate_rows(shape: Shape) -> list[Row]:
    rng = random.Random(shape.seed)
    cutoff = true_cutoff(shape)
    n = shape.rows
    ats: list[datetime] = []
    for _ in range(n):
        if shape.age == "all_eligible":
            delta = -timedelta(days=1, minutes=rng.randint(0, 60 * 24 * 30))
        elif shape.age == "none_eligible":
            delta = timedelta(days=1, minutes=rng.randint(0, 60 * 24 * 5))
        else:
            pick = rng.random()
            if pick < 0.45:  # within three hours of the cutoff, both sides
                delta = timedelta(minutes=rng.choice([-1, 1]) * rng.randint(1, 180))
            elif pick < 0.75:
                delta = -timedelta(minutes=rng.randint(181, 60 * 24 * 30))
            else:
                delta = timedelta(minutes=rng.randint(181, 60 * 24 * 5))
        ats.append(cutoff + delta)
    if shape.ts_ties:  # on the half hour (before ``old`` is decided, so it stays exact)
        ats = [a.replace(minute=a.minute // 30 * 30, second=0, microsecond=0) for a in ats]
    ats.sort()
    keys = _keys(shape, rng, n)
    if not shape.correlated:
        rng.shuffle(keys)
    pool = TENANT_POOLS.get(shape.tenant_type or "", [None])
    rows = []
    for i in range(len(keys)):
        tenant = rng.choice(pool) if shape.tenant_type else None
        status = "keep" if shape.keep and rng.random() < 0.15 else "closed"
        rows.append(Row(keys[i], tenant, ats[i], status))
    # NULLs: a few rows each, old and not kept where that matters, so the shape is decisive.
    olds = [r for r in rows if r.at < cutoff]
    for flag, field in [
        (shape.null_tenant and shape.tenant_type, "tenant"),
        (shape.null_ts, "at"),
        (shape.null_key, "key"),
        (shape.null_keep and shape.keep, "status"),
    ]:
        if flag and rows:
            for r in rng.sample(olds or rows, min(3, len(olds or rows))):
                setattr(r, field, None)
                if field != "status":
                    r.status = "closed"
    if (
        shape.key_layout == "top" and rows and shape.key_type in KEY_RANGES
    ):  # the top key is eligible
        top = max(rows, key=lambda r: r.key if r.key is not None else -(2**64))
        if top.at is not None and top.at < cutoff:
            top.status = "closed"
    if shape.tenant_parts > 1:
        for r in rows:
            r.tenant = None if r.tenant is None else (rng.choice(TENANT_KINDS), r.tenant)
    for r in rows:
        r.old = is_old(shape, _stored_ts(shape, r.at), cutoff)
        r.kept = shape.keep and r.status != "closed"
    return rows


def is_old(shape: Shape, stored, cutoff: datetime) -> bool:
    """Whether a stored timestamp is before the cutoff, as the column's type reads it: a date
    when its whole day (in the policy's zone) is, an epoch number when the instant it counts
    to is."""
    if stored is None:
        return False
    epoch = epoch_of(shape.ts_type)
    if epoch is not None:
        micros = Decimal(stored) * MICROS[epoch[1]]
        return micros < Decimal((cutoff - EPOCH) // timedelta(microseconds=1))
    if shape.ts_type == "date":
        zone = ZoneInfo(shape.timezone)
        end = datetime.combine(stored + timedelta(days=1), datetime.min.time())
        return end <= cutoff.astimezone(zone).replace(tzinfo=None)
    if shape.ts_type == "timestamp":
        return stored < cutoff.astimezone(ZoneInfo(shape.timezone)).replace(tzinfo=None)
    return stored < cutoff


# -- building and running ---------------------------------------------------------------


def has_icu() -> bool:
    """Whether the server can make the case-insensitive (ICU, nondeterministic) collation."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_collation WHERE collname = %s", [COLLATION])
        return cur.fetchone()[0] > 0


def prepare_database() -> None:
    """The extension and collation some shapes use (idempotent; the collation only where
    the server is built with ICU)."""
    with connection.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
        cur.execute(
            "DO $$BEGIN CREATE DOMAIN rr_shape_id AS bigint CHECK (VALUE > 0);"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        )
        cur.execute(
            "DO $$BEGIN CREATE DOMAIN rr_shape_at AS timestamptz;"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        )
        labels = ", ".join(f"'{label}'" for label in ENUM_LABELS)
        cur.execute(
            f"DO $$BEGIN CREATE TYPE {OTHER_KEY_SQL['enum']} AS ENUM ({labels});"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        )
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                f"CREATE COLLATION IF NOT EXISTS {COLLATION}"
                " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
            )
            cur.execute(
                f"CREATE COLLATION IF NOT EXISTS {KEY_COLLATION} (provider = icu, locale = 'de-DE')"
            )
    except DatabaseError:
        pass  # "ICU is not supported in this build": has_icu() says so


def _stored_ts(shape: Shape, at: datetime | None):
    if at is None or shape.ts_type in ("timestamptz", "domain"):
        return at
    epoch = epoch_of(shape.ts_type)
    if epoch is not None:
        micros = (at - EPOCH) // timedelta(microseconds=1)
        if epoch[0] == "numeric":  # fractions of the unit kept
            return Decimal(micros) / MICROS[epoch[1]]
        return micros // MICROS[epoch[1]]
    local = at.astimezone(ZoneInfo(shape.timezone)).replace(tzinfo=None)
    return local.date() if shape.ts_type == "date" else local


def tenant_columns(shape: Shape) -> list[str]:
    if not shape.tenant_type:
        return []
    return ["tenant_kind", "tenant"] if shape.tenant_parts > 1 else ["tenant"]


def key_columns(shape: Shape) -> list[str]:
    return {"": ["id"], "tenant": ["tenant", "id"], "at": ["at", "id"]}[shape.composite]


def build_table(shape: Shape, rows: list[Row]) -> None:
    tenant_col = f", tenant {TENANT_SQL[shape.tenant_type]}" if shape.tenant_type else ""
    if shape.tenant_type and shape.tenant_parts > 1:
        tenant_col = ", tenant_kind text" + tenant_col
    key_null = "" if shape.null_key else " NOT NULL"
    key_sql = OTHER_KEY_SQL.get(shape.key_type, shape.key_type)
    epoch = epoch_of(shape.ts_type)
    ts_sql = epoch[0] if epoch else {
        "timestamptz": "timestamptz", "domain": "rr_shape_at", "date": "date"
    }.get(shape.ts_type, "timestamp")  # fmt: skip
    tenants = tenant_columns(shape)
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{TABLE}, public.{SHADOW}")
        cur.execute(
            f"CREATE TABLE public.{TABLE} (id {key_sql}{key_null}{tenant_col},"
            f" at {ts_sql}, status text, payload text)"
        )
        cols = ", ".join(["id", *tenants, "at", "status", "payload"])
        marks = ", ".join(["%s"] * (4 + len(tenants)))
        data = []
        for r in rows:
            values = [r.key]
            if len(tenants) == 2:
                values += list(r.tenant) if r.tenant is not None else [None, None]
            elif tenants:
                values.append(r.tenant)
            values += [_stored_ts(shape, r.at), r.status, "x" * 20]
            data.append(values)
        if data:
            cur.executemany(f"INSERT INTO public.{TABLE} ({cols}) VALUES ({marks})", data)
        distinct = (
            shape.key_layout not in ("dup", "heavy") and shape.key_type not in NON_UNIQUE_KEYS
        )
        unique = "UNIQUE " if distinct and not shape.null_key else ""
        cols = tenant_columns(shape) + key_columns(shape)
        index = f"({', '.join(dict.fromkeys(cols))})"
        cur.execute(f"CREATE {unique}INDEX ON public.{TABLE} {index}")
        if shape.ts_index == "at":
            cur.execute(f"CREATE INDEX ON public.{TABLE} (at)")
        elif shape.ts_index == "at-key":
            at_key = ", ".join(dict.fromkeys(["at", *key_columns(shape)]))
            cur.execute(f"CREATE INDEX ON public.{TABLE} ({at_key})")
        cur.execute(f"ANALYZE public.{TABLE}")


def policy_spec(shape: Shape, slug: str = "shape") -> dict:
    spec = dict(
        slug=slug,
        name=f"{shape.name} table",
        table=f"public.{TABLE}",
        key=key_columns(shape) if shape.composite else "id",
        timestamp="at",
        retention=shape.retention,
        schedule="0 3 * * *",
        timezone=shape.timezone,
        chunk_size=shape.chunk_size,
        limits={"policy_workers": 2, "tenant_workers": 1},
    )
    if shape.chunking != "auto":
        spec["chunking"] = shape.chunking
    if shape.tenant_type:
        spec["tenant"] = tenant_columns(shape) if shape.tenant_parts > 1 else "tenant"
        if shape.null_tenant_policy != "keep":
            spec["null_tenant"] = shape.null_tenant_policy
    epoch = epoch_of(shape.ts_type)
    if epoch is not None:
        spec["timestamp_unit"] = epoch[1]
    if shape.keep:
        spec["keep"] = [{"column": "status", "op": "=", "value": "keep"}]
    return spec


def _casts(value: str, tenant_type: str) -> bool:
    type_sql = {"varchar_c": "varchar", "varchar_ci": "varchar"}.get(tenant_type, tenant_type)
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(f"SELECT CAST(%s AS {type_sql})", [value])
        return True
    except DatabaseError:
        return False


def place_holds(shape: Shape, policy, actor) -> tuple[list[HoldScope], list[str]]:
    """Place the shape's holds with the action function. A value the tenant column cannot
    hold may be refused (one clear error, nothing placed); any other refusal is a problem."""
    scopes, problems = [], []
    for hold in shape.holds:
        parts = list(hold.tenant) if isinstance(hold.tenant, tuple) else None
        try:
            retention_actions.place_hold(
                actor=actor,
                reason="shape matrix",
                policy=policy if hold.scope == "policy" else None,
                tenant=parts if parts is not None else hold.tenant,
                key_from=hold.key_from,
                key_to=hold.key_to,
            )
        except retention_actions.ActionError as exc:
            # Acceptable refusals: a tenant the column's type cannot hold, or a tenant on a
            # policy without a tenant column (decided conservatively by refusing).
            values = parts[-1:] if parts is not None else [hold.tenant]
            if hold.tenant is not None and (
                not shape.tenant_type or not all(_casts(v, shape.tenant_type) for v in values)
            ):
                continue
            problems.append(f"{hold} refused: {exc}")
            continue
        # as the checker reads a hold: one value, or the JSON array of a tenant's parts
        written = json.dumps(parts) if parts is not None else hold.tenant
        scopes.append(HoldScope(written, hold.key_from, hold.key_to))
    return scopes, problems


def fast_user(username: str, *roles: str):
    """A user holding ``roles``, without a password (hashing one costs more than a shape)."""
    from django.contrib.auth.models import Group, User

    user = User(username=username)
    user.set_unusable_password()
    user.save()
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def run_shape(
    shape: Shape, make_user=fast_user, *, budget_s: float = 60, stats: Counter | None = None
) -> list[str]:
    """Build, run, check. Returns the broken invariants (empty: every invariant holds).
    ``stats`` (a Counter) gets rows, rows deleted, chunks and holds placed added to it."""
    rows = generate_rows(shape)
    build_table(shape, rows)
    policy = approved_policy(make_user, **policy_spec(shape))
    shadow = Shadow("public", SHADOW, None)
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE public.{SHADOW} AS SELECT * FROM public.{TABLE}")
    from django.contrib.auth.models import User

    keeper = User.objects.filter(username="hold-keeper").first() or make_user(
        "hold-keeper", "compliance"
    )
    holds, problems = place_holds(shape, policy, keeper)
    run, _ = trigger_run(policy, tick=shape.tick)
    worker.drain(run.pk, budget_s=budget_s)
    run.refresh_from_db()
    if run.state != Run.State.DRAINED:
        problems.append(f"the run ended {run.state}: {run.state_reason}")
    if shape.expect_chunking and run.chunking != shape.expect_chunking:
        problems.append(f"the run took {run.chunking} chunks: {run.chunking_reason}")
    problems += check_run(run, shadow=shadow, holds=holds)
    if stats is not None:
        audit = AuditRecord.objects.filter(run=run)
        stats["rows"] += len(rows)
        stats["rows deleted"] += sum(audit.values_list("rows_deleted", flat=True))
        stats["chunks"] += audit.count()
        stats["holds placed"] += len(holds)
        stats["shapes that deleted rows"] += audit.filter(rows_deleted__gt=0).exists()
        stats[f"{run.chunking} chunks"] += 1
    return problems


def run_isolated(shape: Shape, make_user=fast_user, **kwargs) -> list[str]:
    """``run_shape`` inside a savepoint that is rolled back: nothing stays behind."""
    with transaction.atomic():
        problems = run_shape(shape, make_user, **kwargs)
        transaction.set_rollback(True)
    return problems
