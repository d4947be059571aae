"""The archive's own retention (docs/policies.md, "Archiving before deleting"):
``[archive] keep_years = N`` in the approved version of a policy removes a run's archive
objects once the run's cutoff is N years old.

It is a key of the policy like any other, so it changes only through a new version approved
by a second person. The reconciler's pass calls ``expire_archives`` for each policy: for each
run of this database whose time has come, one audit record (outcome "expired", chain version
8, ``archive`` naming every object removed with its row count and SHA-256 as the chain holds
them) is appended in the pass's transaction, and the files are removed only once it commits —
an object is never gone without its record. A file an expired record names that is still
there (a pass stopped between the two) is removed by the orphan step
(``reconciler.remove_archive_orphans``). An object stays while an open legal hold could
cover one of its rows (``held_by``), and is expired by a later pass once the hold is released.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from retention.holds import parts_of
from retention.models import LegalHold, Policy, PolicyVersion
from runs.evidence import archives
from runs.models import Run

EXPIRED = archives.EXPIRED


def expiry_of(cutoff: datetime, years: int) -> datetime:
    """When the archive of a run with ``cutoff`` expires: the cutoff ``years`` later (29
    February to 28 February)."""
    try:
        return cutoff.replace(year=cutoff.year + years)
    except ValueError:
        return cutoff.replace(year=cutoff.year + years, day=28)


def _open_holds(policy: Policy) -> list[LegalHold]:
    return list(
        LegalHold.objects.filter(released_at__isnull=True).filter(
            Q(policy__isnull=True) | Q(policy=policy)
        )
    )


def held_by(holds: list[LegalHold], spec, path) -> LegalHold | None:
    """The first open hold that could cover a row of the object at ``path``, or None. A hold on
    a tenant is judged by the object's tenant column, a key interval by its key column's
    range; whatever cannot be judged that way (a tenant or key of several columns, a key that
    is not an integer) counts as covered."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for hold in holds:
        tenant = parts_of(hold.tenant)
        bounded = hold.key_from is not None or hold.key_to is not None
        if tenant is None and not bounded:
            return hold
        if tenant is not None and len(spec.tenant_columns) != 1:
            return hold
        if bounded and len(spec.key_columns) != 1:
            return hold
        columns = ([spec.tenant_columns[0]] if tenant is not None else []) + (
            [spec.key_columns[0]] if bounded else []
        )
        table = pq.read_table(path, columns=columns)
        if tenant is not None:
            values = pc.cast(table.column(spec.tenant_columns[0]), "string")
            mask = pc.equal(values, tenant[0])
            table = table.filter(mask)
            if table.num_rows == 0:
                continue
        if bounded:
            keys = table.column(spec.key_columns[0])
            if not pa.types.is_integer(keys.type):
                return hold
            low, high = pc.min_max(keys).values()
            if low.as_py() is None:
                continue
            if hold.key_to is not None and low.as_py() >= hold.key_to:
                continue
            if hold.key_from is not None and high.as_py() < hold.key_from:
                continue
        return hold
    return None


def expire_archives(
    policy: Policy, now: datetime | None = None, *, version: PolicyVersion | None = None
) -> list[str]:
    """Expire the archive objects of ``policy``'s runs whose cutoff is older than the approved
    version's ``[archive] keep_years`` (nothing without it), in the caller's transaction; the
    files go once it commits. One line per run expired and per object kept by a hold.
    ``version``: the policy's approved version as the caller read it (read here when not
    given)."""
    version = version or policy.approved_version
    spec = version.parsed if version is not None else None
    if spec is None or not spec.archive_keep_years:
        return []
    now = now or timezone.now()
    years = spec.archive_keep_years
    holds = _open_holds(policy)
    lines: list[str] = []
    for run in Run.objects.filter(pk__in=_unexpired_runs(policy.pk)).order_by("pk"):
        if expiry_of(run.cutoff, years) > now:
            continue
        gone = archives.expired_names(run.pk)
        due = [
            o
            for o in archives.run_objects(run.pk)
            if not archives.in_table(o) and o["name"] not in gone
        ]
        kept = []
        for o in due:
            path = archives.object_path(o["to"], o["name"])
            hold = held_by(holds, spec, path) if holds and path.is_file() else None
            if hold is not None:
                kept.append(o)
                lines.append(f"{o['name']}: kept, under legal hold #{hold.pk}")
        expired = [o for o in due if o not in kept]
        if not expired:
            continue
        _record(run, version, spec, expired, years, now)
        paths = [archives.object_path(o["to"], o["name"]) for o in expired]
        transaction.on_commit(lambda paths=paths: _remove(paths))
        lines.append(
            f"run {run.run_key}: {len(expired)} archive object(s) expired"
            f" (cutoff {run.cutoff:%Y-%m-%d}, keep_years = {years})"
        )
    return lines


def _unexpired_runs(policy_id: int) -> list[int]:
    """The policy's runs with archive objects that no expiry record names yet (by count)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT a.run_id FROM runs_auditrecord a JOIN runs_run r ON r.id = a.run_id"
            " WHERE r.policy_id = %s AND a.archive IS NOT NULL"
            " AND a.outcome IN ('deleted', %s) GROUP BY a.run_id"
            " HAVING sum(jsonb_array_length(a.archive->'objects'))"
            "  FILTER (WHERE a.outcome = 'deleted')"
            " > coalesce(sum(jsonb_array_length(a.archive->'objects'))"
            "  FILTER (WHERE a.outcome = %s), 0)",
            [policy_id, EXPIRED, EXPIRED],
        )
        return [row[0] for row in cur.fetchall()]


def _remove(paths) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _record(run: Run, version, spec, expired: list[dict], years: int, now: datetime) -> None:
    """The expiry's audit record, in the caller's transaction: every object it removes."""
    by_to: dict[str, list[dict]] = {}
    for o in expired:
        by_to.setdefault(o["to"], []).append(o)
    for to, items in by_to.items():
        archives.append_object_record(
            run,
            version,
            spec,
            table=items[0]["table"],
            tenant="",
            outcome=EXPIRED,
            started_at=now,
            archive={
                "to": to,
                "expired": True,
                "keep_years": years,
                "objects": [archives.object_facts(o) for o in items],
            },
        )
