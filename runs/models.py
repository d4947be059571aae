"""The ledger: runs, their chunks, the audit trail and dead letters.

PostgreSQL rows here are the record of what work exists and what was deleted;
django-q2 only delivers ids. See docs/engine.md for states and transactions.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.oplog import decision_token
from retention.models import Policy, PolicyVersion
from retention.predicate import Scope, shown_value


class Run(models.Model):
    """One logical run per (policy, scheduled tick); ``run_key`` makes triggers converge."""

    class State(models.TextChoices):
        WAITING = "waiting", "waiting for an earlier run"
        CONFIRM = "confirm", "held for confirmation"
        ACTIVE = "active"
        PAUSED = "paused"
        DRAINED = "drained"
        # a count run (rollout "count") planned and counted what a full run would delete
        COUNTED = "counted"
        ATTENTION = "attention", "needs attention"
        SUPERSEDED = "superseded"
        CANCELLED = "cancelled"
        SKIPPED = "skipped"
        EXPIRED = "expired", "expired unconfirmed"

    TERMINAL = (
        State.DRAINED,
        State.COUNTED,
        State.SUPERSEDED,
        State.CANCELLED,
        State.SKIPPED,
        State.EXPIRED,
    )
    OPEN = (State.WAITING, State.CONFIRM, State.ACTIVE, State.PAUSED, State.ATTENTION)

    run_key = models.CharField(max_length=200, unique=True)
    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="runs")
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="runs")
    tick = models.DateTimeField(help_text="the scheduled tick this run belongs to")
    cutoff = models.DateTimeField(help_text="rows older than this are eligible; fixed at creation")
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    state_reason = models.TextField(blank=True)
    source = models.CharField(max_length=16, default="schedule")  # schedule | manual | catch-up
    skipped_ticks = models.JSONField(default=list, blank=True)
    created_by = models.CharField(max_length=150, default="scheduler")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    pass_no = models.PositiveIntegerField(default=1)
    planner_done = models.BooleanField(default=False)
    chunk_size = models.PositiveIntegerField(default=0, help_text="current adaptive chunk size")
    expected_rows = models.BigIntegerField(null=True, blank=True)
    held_at = models.DateTimeField(
        null=True, blank=True, help_text="when the blast-radius guard held it for confirmation"
    )
    verification = models.JSONField(null=True, blank=True)
    # The rollout stage of its version, fixed at creation (``spec.ROLLOUT_STAGES``): a count
    # run deletes nothing and ends counted; a slice run deletes only rows older than
    # ``slice_bound`` (its cutoff minus the version's slice), one chunk at a time.
    rollout = models.CharField(max_length=8, default="full")
    slice_bound = models.DateTimeField(
        null=True, blank=True, help_text="a slice run deletes rows older than this"
    )
    # What its chunks run along, chosen at creation and fixed, like the cutoff
    # (retention.geometry): "tenant", "key" or "timestamp"; "" on a run created before the
    # choice existed.
    chunking = models.CharField(max_length=16, blank=True, default="")
    chunking_reason = models.TextField(blank=True)
    # The columns its chunks' bounds are on when they are not the key's: timestamp chunks'
    # (timestamp, key…) or (timestamp,), fixed at creation (``bound_columns``).
    chunk_columns = models.JSONField(default=list, blank=True)
    # A run of a period whose earlier run a newly approved version superseded (a re-run, its
    # key the period's with "/v<number>" appended): the run it replaces.
    replaces = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="reruns"
    )
    # Why a lease last admitted nothing for a reason no chunk carries (the partition step held
    # back by the guard, planning postponed, ceilings full), and when it last saw it:
    # ``runs.status`` names it while it is newer than the last commit (``worker.note_idle``).
    idle_reason = models.TextField(blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-tick", "-id"]
        constraints = [
            # invariant 1: one live run per policy and period; superseded runs stay as history
            models.UniqueConstraint(
                fields=["policy", "tick"],
                condition=~Q(state="superseded"),
                name="run_one_live_per_period",
            )
        ]
        indexes = [
            models.Index(fields=["state"], name="run_state"),
            # the reconciler's look at drained runs whose VACUUM waits on a task (a few at most)
            models.Index(
                fields=["policy"],
                condition=Q(state="drained")
                & Q(verification__vacuum_state__in=["scheduled", "running"]),
                name="run_vacuum_waiting",
            ),
        ]

    def __str__(self) -> str:
        return self.run_key

    @property
    def decision_state(self) -> str:
        return self.state

    @property
    def decision_token(self) -> str:
        return decision_token(self)

    def describe(self) -> str:
        reason = f" ({self.state_reason})" if self.state_reason else ""
        return f"{self.get_state_display()}{reason}"

    @property
    def is_terminal(self) -> bool:
        return self.state in self.TERMINAL

    @property
    def bound(self):
        """What its DELETE, planner and verification compare the timestamp with: the slice
        bound of a slice run, else the cutoff."""
        return self.slice_bound or self.cutoff

    @property
    def counts_only(self) -> bool:
        """A count run: it plans and counts, and deletes nothing."""
        return self.rollout == "count"

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from start to finish (to now while it is open); None before it started."""
        if self.started_at is None:
            return None
        return ((self.finished_at or timezone.now()) - self.started_at).total_seconds()

    def per_tenant(self, spec) -> bool:
        """Whether its chunks are one tenant's each (else ranges across tenants)."""
        if self.chunking:
            return self.chunking == "tenant" and bool(spec.tenant)
        return bool(spec.tenant)

    def bound_columns(self, spec) -> tuple[str, ...]:
        """The columns its chunks' bounds are on (``predicate.chunk_columns``): the stored
        chunk columns of timestamp chunks, else the key's. Only a chunk's scope compares with
        them; legal holds, keep rules and NULL keys go by the key."""
        if self.chunking == "timestamp" and self.chunk_columns:
            return tuple(self.chunk_columns)
        return spec.key_columns

    def own_bound_columns(self) -> list[str] | None:
        """The chunk columns when they are not the key (what an audit record names), or None."""
        return list(self.chunk_columns) if self.chunking == "timestamp" else None


class PlannerCursor(models.Model):
    """Where the planner's keyset walk stands, per run pass and tenant ('' = whole table)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="cursors")
    pass_no = models.PositiveIntegerField()
    tenant = models.TextField(blank=True, default="")  # any value the target column holds
    next_key = models.BigIntegerField(null=True, blank=True)  # integer keys, before v2 bounds
    bound_key = models.BigIntegerField(
        null=True, blank=True, help_text="last eligible key at planning"
    )
    # The walk's position and its last eligible key in any key type: one text per key column
    # (``retention.predicate.Bound``). NULL on a cursor written before: read next_key/bound_key.
    next_at = models.JSONField(null=True, blank=True)
    bound_at = models.JSONField(null=True, blank=True)
    exhausted = models.BooleanField(default=False)
    chunks_planned = models.PositiveIntegerField(default=0)
    # The verification's read above the walk's last key, taken while the pass's last chunks
    # were deleted (``runs.engine.reconciler.read_above``): the highest key then, and the
    # eligible keys it found above the last key. NULL: not taken (the finish reads it all).
    read_above = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "pass_no", "tenant"], name="cursor_unique")
        ]

    def __str__(self) -> str:
        return f"cursor {self.run_id}/{self.pass_no}/{self.tenant or '*'} at {self.position()}"

    def position(self) -> tuple | None:
        return _bound(self.next_at, self.next_key)

    def last(self) -> tuple | None:
        return _bound(self.bound_at, self.bound_key)


def _bound(values, integer) -> tuple | None:
    """A stored bound as a tuple of texts (``predicate.Bound``): the JSON array, else the
    bigint column of a row written before bounds of any type existed; None: unbounded."""
    if values is not None:
        return tuple(values)
    return None if integer is None else (str(integer),)


def show_bound(value: tuple | None, *, end: bool = False, reader=None) -> str:
    """A bound as people read it: ``42``, ``2026-11-01 10:00:00+00`` or ``(7, 1043)``;
    an open end is ``∞``. ``reader``: (the policy's spec, the columns the bound is on), so an
    epoch timestamp reads as the instant it counts to (``predicate.shown_value``)."""
    if value is None:
        return "∞" if end else "−∞"
    if reader is not None:
        spec, columns = reader
        value = tuple(shown_value(spec, c, v) for c, v in zip(columns, value, strict=False))
    return value[0] if len(value) == 1 else f"({', '.join(value)})"


def show_columns(columns) -> str:
    """Columns as people read them: ``occurred_at`` or ``(occurred_at, id)``."""
    columns = list(columns)
    return columns[0] if len(columns) == 1 else f"({', '.join(columns)})"


class ChunkQuerySet(models.QuerySet):
    def pending(self):
        """Chunks still to be deleted (admissible now or backing off)."""
        return self.filter(state=Chunk.State.PENDING)

    def troubled(self):
        """Chunks retried, throttled or failed at least once (``TROUBLED``)."""
        return self.filter(TROUBLED)

    def throttled(self, since):
        """Pending chunks the guard pushed back, to a time after ``since``, with its reason."""
        return self.pending().filter(not_before__gt=since).exclude(throttle_reason="")


# A chunk that was retried, throttled or failed (``Chunk.objects.troubled()``; the partial
# index ``chunk_troubled`` has the same condition, so the planner can use it).
TROUBLED = Q(attempts__gt=1) | ~Q(throttle_reason="") | ~Q(last_error="")


class Chunk(models.Model):
    """An immutable unit of work: rows of ``tenant`` with key in [key_from, key_to) older than the
    run's cutoff, minus kept and held rows. Identity is (run, pass, tenant, key_from, key_to).
    ``key_to`` NULL means "to the end": the chunk that holds the largest bigint key."""

    class State(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        DEAD = "dead", "dead-lettered"
        SPLIT = "split"
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="chunks")
    pass_no = models.PositiveIntegerField(default=1)
    tenant = models.TextField(blank=True, default="")  # any value the target column holds
    seq = models.PositiveIntegerField(help_text="order within the tenant; claims go round-robin")
    # The bounds as bigints, for a plain integer key (NULL for any other key type).
    key_from = models.BigIntegerField(null=True, blank=True)
    # NULL: to the end of the key range (the chunk ends at the largest bigint)
    key_to = models.BigIntegerField(null=True, blank=True)
    # The bounds in any key type: one text per key column, as PostgreSQL writes the value
    # (cast back to the column's type in the DELETE). ``hi`` NULL: to the end of the keys.
    # ``lo`` NULL only on a chunk written before: its bounds are key_from/key_to.
    lo = models.JSONField(null=True, blank=True)
    hi = models.JSONField(null=True, blank=True)
    planned_rows = models.PositiveIntegerField(default=0)
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Set and committed when an attempt claims the chunk, cleared when its outcome is recorded:
    # still set on a later claim, it means that attempt was killed (task timeout, crash).
    claimed_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True)
    last_sqlstate = models.CharField(max_length=5, blank=True)
    throttle_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True)
    # A count run's chunk: what its DELETE would have removed, counted by the same predicate
    # in its own short statement ({"rows", "kept", "held", "cascade", "tenants": {t: rows},
    # "ages": {"YYYY-MM": rows}}; ``runs.counts``). NULL for a chunk that deletes.
    counts = models.JSONField(null=True, blank=True)

    objects = ChunkQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "pass_no", "tenant", "key_from", "key_to", "lo", "hi"],
                name="chunk_identity_v2",
                nulls_distinct=False,  # one "to the end" chunk per start, too
            ),
            models.CheckConstraint(
                condition=Q(key_from__lt=models.F("key_to")), name="chunk_interval"
            ),
        ]
        indexes = [
            models.Index(
                fields=["run", "seq", "id"], condition=Q(state="pending"), name="chunk_pending"
            ),
            models.Index(
                fields=["run", "state"],
                include=["tenant", "planned_rows", "attempts", "created_at", "not_before"],
                name="chunk_run_state",
            ),
            # the run page's throttle and retry history: the few chunks that were retried,
            # throttled or failed, newest first, without visiting the run's other chunks
            models.Index(
                fields=["run", "-not_before"],
                condition=TROUBLED,
                name="chunk_troubled",
            ),
        ]

    def __str__(self) -> str:
        tenant = f" tenant {self.tenant}" if self.tenant else ""
        return f"chunk #{self.pk}{tenant} {self.interval}"

    def bounds(self) -> tuple[tuple | None, tuple | None]:
        """(from, to) as tuples of texts (``predicate.Bound``); to None: to the end."""
        lo = _bound(self.lo, self.key_from)
        hi = tuple(self.hi) if self.lo is not None and self.hi is not None else None
        if self.lo is None:
            hi = _bound(None, self.key_to)
        return lo, hi

    def read_with(self, run: Run) -> Chunk:
        """Show the bounds in the run's own terms (``interval``): an epoch timestamp's as an
        instant. ``run`` with its policy version loaded; returns the chunk."""
        spec = run.policy_version.parsed
        self._reader = (spec, run.bound_columns(spec))
        return self

    @property
    def interval(self) -> str:
        lo, hi = self.bounds()
        reader = getattr(self, "_reader", None)
        return f"[{show_bound(lo, reader=reader)}, {show_bound(hi, end=True, reader=reader)})"


class AuditRecord(models.Model):
    """One row per committed chunk, in the chunk's transaction. Append-only (a trigger rejects
    UPDATE and DELETE) and chained: ``hash`` covers the row and ``prev_hash``."""

    chain_seq = models.BigIntegerField(unique=True)
    # NULL only for a restore's record (outcome "restored"): it re-inserts a run's archived
    # rows and belongs to no chunk (runs.restores)
    chunk = models.OneToOneField(
        Chunk, on_delete=models.PROTECT, related_name="audit", null=True, blank=True
    )
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="audit_records")
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT)
    policy_slug = models.CharField(max_length=80)
    table_name = models.CharField(max_length=130)
    cutoff = models.DateTimeField()
    tenant = models.TextField(blank=True)
    key_from = models.BigIntegerField(null=True, blank=True)  # a plain integer key only
    key_to = models.BigIntegerField(null=True, blank=True)  # NULL: to the end of the key range
    # Chain version 3: the chunk's bounds in any key type, one text per key column (hashed).
    key_lo = models.JSONField(null=True, blank=True)
    key_hi = models.JSONField(null=True, blank=True)
    # Chain version 5: a chunk across tenants — rows deleted per tenant ({tenant: rows}).
    tenant_rows = models.JSONField(null=True, blank=True)
    # Chain version 6: the columns key_lo/key_hi are on when they are not the key's
    # (timestamp chunks: ["occurred_at", "id"] or ["occurred_at"]); NULL: the key's.
    bound_columns = models.JSONField(null=True, blank=True)
    # Chain version 7: a chunk of a table that cascading foreign keys reference — the rows it
    # removed in each table its DELETE reaches ({"schema.table": rows}, its own table included).
    table_rows = models.JSONField(null=True, blank=True)
    # Chain version 8: a chunk archived before its DELETE — where its rows were written
    # ({"to": "file:///DIR", "objects": [{"name", "table", "rows", "sha256"}]}).
    archive = models.JSONField(null=True, blank=True)
    # Chain version 9: a chunk of a table with a row-level BEFORE DELETE trigger — the rows its
    # DELETE matched that are still there after it (the trigger returned NULL for them: kept).
    rows_kept_by_triggers = models.BigIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField()
    worker_host = models.CharField(max_length=200)
    worker_pid = models.IntegerField()
    rows_deleted = models.BigIntegerField()
    started_at = models.DateTimeField()
    committed_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, default="deleted")
    # Chain version 2 (runs.evidence.audit): what the record says about the run and the approved
    # version, as they were when the chunk committed. Version 1 records leave them empty.
    chain_version = models.PositiveSmallIntegerField(default=2)
    run_key = models.CharField(max_length=200, blank=True)
    version_number = models.PositiveIntegerField(null=True, blank=True)
    version_hash = models.CharField(max_length=64, blank=True)
    author_id = models.IntegerField(null=True, blank=True)
    submitted_by_id = models.IntegerField(null=True, blank=True)
    approved_by_id = models.IntegerField(null=True, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    approval_reason = models.TextField(blank=True)
    # Chain version 3: a partition detached (and dropped) whole — name, bounds, rows and the
    # md5 of its ordered keys, taken before the drop (runs.engine.partitions). NULL for a chunk.
    partition = models.JSONField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["chain_seq"]
        indexes = [
            models.Index(fields=["run", "chain_seq"], name="audit_run"),
            models.Index(
                fields=["run"],
                include=["rows_deleted", "committed_at", "tenant"],
                name="audit_run_totals",
            ),
            models.Index(fields=["policy_slug", "committed_at"], name="audit_policy_time"),
            # progress's per-tenant rows of chunks across tenants: only those audit rows
            models.Index(
                fields=["run"], condition=Q(tenant_rows__isnull=False), name="audit_across"
            ),
            # a run's rows of the last ten minutes (progress's rate) and its rows/s chart: a
            # range of the run's commit times, without visiting the heap
            models.Index(
                fields=["run", "committed_at"], include=["rows_deleted"], name="audit_run_time"
            ),
            # the rows per table cascades reached: only the records that have them
            models.Index(
                fields=["run"], condition=Q(table_rows__isnull=False), name="audit_cascaded"
            ),
        ]

    def __str__(self) -> str:
        return f"audit #{self.chain_seq} chunk {self.chunk_id}: {self.rows_deleted} rows"

    @property
    def interval(self) -> str:
        """The deleted chunk's key interval, readably (any chain version); the columns first
        when they are not the key's: ``(occurred_at, id) [(…, …), (…, …))``."""
        lo = _bound(self.key_lo, self.key_from)
        hi = tuple(self.key_hi) if self.key_hi is not None else None
        if self.key_lo is None:
            hi = _bound(None, self.key_to)
        on = f"{show_columns(self.bound_columns)} " if self.bound_columns else ""
        spec = getattr(self, "_spec", None)
        reader = (spec, self.bound_columns or spec.key_columns) if spec is not None else None
        return f"{on}[{show_bound(lo, reader=reader)}, {show_bound(hi, end=True, reader=reader)})"

    def read_with(self, spec) -> AuditRecord:
        """Show the bounds in the terms of ``spec`` (its version's): an epoch timestamp's as
        an instant (``interval``). Returns the record."""
        self._spec = spec
        return self


class Checkpoint(models.Model):
    """A signed anchor of both hash chains, taken by the checkpoint job
    (``retention audit checkpoint``, the only process that holds ``RETENTION_EVIDENCE_KEY``)
    and stored here so every run manifest carries the latest one. Its ``signature``
    (Ed25519, ``ed25519:…``; an earlier release's HMAC without the prefix) signs the anchor
    document (``runs.evidence.anchors.document``); the database cannot make one, and a row
    whose signature does not verify is never served (``anchors.latest_checkpoint``).
    Written once, after the WAL holds every record it anchors (``anchors.take_checkpoint``);
    append-only like the chains. A target's checkpoints (``target``) are stored in the control
    database (``anchors.take_target_checkpoint``)."""

    at = models.DateTimeField()
    audit_seq = models.BigIntegerField()
    audit_hash = models.CharField(max_length=64, blank=True)  # '': an empty chain
    operator_seq = models.BigIntegerField()
    operator_hash = models.CharField(max_length=64, blank=True)
    signature = models.CharField(max_length=200, db_column="hmac")
    host = models.CharField(max_length=200, help_text="where the checkpoint job ran")
    # '': this database's own chains; a target's name: that target's chains, anchored here in
    # the control database, out of the reach of the target's logins (its name is signed too)
    target = models.CharField(max_length=63, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"checkpoint #{self.pk} at audit record {self.audit_seq}"


class PartitionAction(models.Model):
    """What a run did with one partition it could take whole (docs/engine.md, "Partitions").
    Recorded before the detach, so a detach interrupted by a crash is finished (or undone) by
    the next attempt; ``chunk`` is the pass-0 ledger chunk whose audit record proves it."""

    class State(models.TextChoices):
        DETACHING = "detaching"
        DROPPED = "dropped"
        DETACHED = "detached", "detached (kept)"
        LEFT = "left", "left attached (deleted in chunks)"
        # an operator kept a partition detached that could not be put back (its dead letter
        # discarded): its rows are neither deleted nor audited, nor visible to the application
        KEPT = "kept", "kept detached by an operator (not audited)"

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="partition_actions")
    schema = models.CharField(max_length=63)
    name = models.CharField(max_length=63)
    bounds = models.TextField()
    action = models.CharField(max_length=8)  # the policy's partition_action: drop | detach
    concurrently = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.DETACHING)
    rows = models.BigIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=40, blank=True)
    note = models.TextField(blank=True)  # why a partition was left attached
    # Failed attempts to finish a detaching partition (a lock timeout, a conflict on putting it
    # back), and when the next may start: ``runs.engine.partitions``.
    attempts = models.PositiveIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True)
    chunk = models.OneToOneField(
        Chunk, on_delete=models.PROTECT, null=True, blank=True, related_name="partition_action"
    )
    created_at = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True)
    # A detached partition's table dropped by the reconciler once the policy's detached_keep
    # had passed (the state stays "detached": its audit record says what the run took)
    dropped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "schema", "name"], name="partition_action_once")
        ]

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}: {self.get_state_display()}"


class DeadLetter(models.Model):
    """A chunk (or message) that cannot make progress without a person."""

    class Resolution(models.TextChoices):
        OPEN = "open"
        REPLAYED = "replayed"
        DISCARDED = "discarded"

    chunk = models.ForeignKey(
        Chunk, on_delete=models.PROTECT, null=True, blank=True, related_name="dead_letters"
    )
    run = models.ForeignKey(
        Run, on_delete=models.PROTECT, null=True, blank=True, related_name="dead_letters"
    )
    error_class = models.CharField(max_length=32)
    sqlstate = models.CharField(max_length=5, blank=True)
    message = models.TextField()
    context = models.JSONField(default=dict)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    resolution = models.CharField(
        max_length=16, choices=Resolution.choices, default=Resolution.OPEN
    )
    resolved_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["chunk"],
                condition=Q(resolution="open"),
                name="deadletter_one_open_per_chunk",
            )
        ]

    def __str__(self) -> str:
        return f"dead letter #{self.pk} ({self.error_class})"


MAX_DISCARDED_SCOPES = 200  # a run excludes at most this many; discarding one more is refused


def discarded_letters(run: Run):
    """The run's discarded chunk dead letters, oldest first (at most ``MAX_DISCARDED_SCOPES``)."""
    return _discarded(run).select_related("chunk")[:MAX_DISCARDED_SCOPES]


def _discarded(run: Run):
    return (
        DeadLetter.objects.filter(run=run, resolution=DeadLetter.Resolution.DISCARDED)
        .exclude(chunk=None)
        .order_by("id")
    )


def discarded_scope_rows(run: Run):
    """The query of the discarded scopes' chunks as rows (tenant, key_from, key_to, lo, hi),
    for a statement that reads them along with other things (``runs.engine.worker``); ``scopes_of``
    makes them scopes."""
    return _discarded(run).values_list(
        "chunk__tenant", "chunk__key_from", "chunk__key_to", "chunk__lo", "chunk__hi"
    )[:MAX_DISCARDED_SCOPES]


def scopes_of(run: Run, rows) -> list:
    """``discarded_scope_rows`` as scopes (``predicate.Scope``)."""
    spec = run.policy_version.parsed
    per_tenant = run.per_tenant(spec)
    columns = run.bound_columns(spec)
    return [
        Scope(
            tenant if per_tenant else None,
            *Chunk(key_from=a, key_to=b, lo=lo, hi=hi).bounds(),
            columns,
        )
        for tenant, a, b, lo, hi in rows
    ]


def discarded_scopes(run: Run) -> list:
    """The scopes (tenant, key interval) an operator gave up on: the run's later passes, their
    DELETEs and its verification leave them out (``predicate.outside_scopes``)."""
    return scopes_of(run, discarded_scope_rows(run))


class Lease(models.Model):
    """A run's delivery slot: one django-q2 message drains chunks of the run for a time budget,
    then re-enqueues itself. The reconciler keeps ``slot < concurrency`` leases alive."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases")
    slot = models.PositiveIntegerField()
    generation = models.PositiveIntegerField(default=0)
    enqueued_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "slot"], name="lease_unique_slot")]

    def __str__(self) -> str:
        return f"lease {self.run_id}/{self.slot} gen {self.generation}"


class GuardSample(models.Model):
    """One reading of the database's pressure signals, shared by every worker.

    ``values`` holds instance-wide signals; ``tables`` holds per-target readings keyed by
    "schema.table" (probe latency, lock waits and conflicting locks on it, dead tuples,
    autovacuum). Taken by one sampler at a time (advisory lock); kept for a day."""

    taken_at = models.DateTimeField(default=timezone.now, db_index=True)
    values = models.JSONField(default=dict)
    tables = models.JSONField(default=dict)

    class Meta:
        ordering = ["-taken_at"]

    def __str__(self) -> str:
        return f"guard sample {self.taken_at:%H:%M:%S}"


class GuardControl(models.Model):
    """The guard's latency controller for one policy (runs.engine.guard, docs/guard.md): the
    knobs it sets — chunk transactions at once, the chunk's target duration, the duty cycle —
    and what it measured when it last moved them. One row per policy, shared by every worker
    process and host; a step takes the row lock (``SELECT … FOR UPDATE SKIP LOCKED``), so one
    worker steps it at a time. Every step is also kept as a ``GuardControlStep``."""

    policy = models.OneToOneField(
        "retention.Policy", on_delete=models.CASCADE, related_name="guard_control"
    )
    concurrency = models.PositiveIntegerField()
    chunk_ms = models.PositiveIntegerField()
    duty_cycle = models.FloatField()
    stepped_at = models.DateTimeField(default=timezone.now)
    # what the last step measured: probe p99 since the step before, the idle baseline's p99,
    # their ratio, the budget it was judged against, and its verdict in words
    probe_p99_ms = models.FloatField(null=True)
    baseline_ms = models.FloatField(null=True)
    inflation = models.FloatField(null=True)
    budget = models.FloatField()
    # the limit in milliseconds the measured p99 was judged against (docs/guard.md, "The
    # limit"): the policy's absolute p99, or its relative limit over the idle value
    limit_ms = models.FloatField(null=True)
    action = models.CharField(max_length=16, default="hold")
    reason = models.TextField(blank=True, default="")
    # while the table's runs drain without pause and the probe has no idle reading in the
    # baseline window, the controller stops the policy's chunks until then so that the sampler
    # can take idle probes (a baseline the run's own load does not lift)
    quiet_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"guard control of policy {self.policy_id}"


class GuardControlStep(models.Model):
    """One step of a policy's latency controller, as it was taken: the history the run page,
    the tests and docs/guard.md's chart read. Kept for a day, like the samples."""

    policy = models.ForeignKey(
        "retention.Policy", on_delete=models.CASCADE, related_name="guard_steps"
    )
    taken_at = models.DateTimeField(default=timezone.now, db_index=True)
    concurrency = models.PositiveIntegerField()
    chunk_ms = models.PositiveIntegerField()
    duty_cycle = models.FloatField()
    probe_p99_ms = models.FloatField(null=True)
    baseline_ms = models.FloatField(null=True)
    inflation = models.FloatField(null=True)
    budget = models.FloatField()
    limit_ms = models.FloatField(null=True)
    samples = models.PositiveIntegerField(default=0)
    action = models.CharField(max_length=16)
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["taken_at", "id"]

    def __str__(self) -> str:
        return f"guard step {self.taken_at:%H:%M:%S} {self.action}"


class RestoreRequest(models.Model):
    """Re-inserting a run's archived rows (docs/runbook.md, "Restoring rows"): requested by one
    member of compliance, approved by another (as a hold's release), then carried out object
    by object, each in a transaction with its audit record (outcome "restored")."""

    class State(models.TextChoices):
        REQUESTED = "requested"
        APPROVED = "approved"  # approved; its objects are being restored
        DONE = "done"

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="restores")
    tenant = models.TextField(blank=True, default="")  # "": every tenant
    time_from = models.DateTimeField(null=True, blank=True)  # rows whose timestamp is >= this
    time_to = models.DateTimeField(null=True, blank=True)  # and < this
    state = models.CharField(max_length=16, choices=State.choices, default=State.REQUESTED)
    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField(default=timezone.now)
    request_reason = models.TextField()
    approved_by = models.CharField(max_length=150, blank=True, default="")
    approved_at = models.DateTimeField(null=True, blank=True)
    approval_reason = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(approved_by="") | ~Q(approved_by=models.F("requested_by")),
                name="restorerequest_four_eyes",
            )
        ]

    def __str__(self) -> str:
        return f"restore #{self.pk} of {self.run_id}"

    def scope(self) -> str:
        """What it restores, as people read it."""
        parts = [f"tenant {self.tenant}" if self.tenant else "every tenant"]
        if self.time_from:
            parts.append(f"from {self.time_from.isoformat()}")
        if self.time_to:
            parts.append(f"to {self.time_to.isoformat()}")
        return ", ".join(parts)

    def describe(self) -> str:
        return f"{self.state}: {self.scope()}"
