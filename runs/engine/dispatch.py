"""Publishing work to the cleanup cluster.

A message is a time-budgeted lease on one run's work: it carries only ids
(run, slot, generation). With the ORM broker the enqueue is an INSERT in the
caller's transaction, so the ledger is a transactional outbox; with another
broker the message is sent after commit and the reconciler re-publishes
anything lost. A delivery whose generation is not the lease's current one
exits at once, so re-publishing never multiplies workers.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from runs.models import Lease, Run
from targets import connections as fleet_connections

CLUSTER = "cleanup"
DRAIN_TASK = "runs.tasks.drain_lease"


def _on_target(kwargs: dict) -> bool:
    """On a target (``targets.connections.on``) the message names it and goes to the control
    database's queue once the target's transaction has committed: no outbox spans two
    databases, and the reconciler re-publishes a lease whose message was lost."""
    name = fleet_connections.current()
    if name == fleet_connections.DEFAULT:
        return False
    kwargs["target"] = name
    return True


def _send_to_control(func: str, args, kwargs) -> None:
    with fleet_connections.on(fleet_connections.DEFAULT):
        async_task(func, *args, cluster=CLUSTER, **kwargs)


def enqueue(func: str, *args, **kwargs) -> None:
    """Send a task to the cleanup cluster: in this transaction (ORM broker) or after it commits."""

    def send() -> None:
        async_task(func, *args, cluster=CLUSTER, **kwargs)

    if _on_target(kwargs):
        transaction.on_commit(lambda: _send_to_control(func, args, kwargs))
        return
    if settings.RETENTION["BROKER"] == "orm":
        send()
    else:
        transaction.on_commit(send)


def enqueue_after_commit(func: str, *args, **kwargs) -> None:
    """Send a task to the cleanup cluster once the current transaction has committed, with any
    broker: for work that follows a decision (a drained run's ``VACUUM``) and must neither
    start before that decision is visible nor go when it rolls back. Unlike ``enqueue`` this
    is no outbox: a process that dies between the commit and the send loses the message, and
    a failed send is logged, never raised into the caller, whose transaction has committed."""

    def send() -> None:
        async_task(func, *args, cluster=CLUSTER, **kwargs)

    if _on_target(kwargs):
        transaction.on_commit(lambda: _send_to_control(func, args, kwargs), robust=True)
        return
    transaction.on_commit(send, robust=True)


def publish(lease: Lease) -> Lease:
    """Start a new generation of ``lease`` and enqueue its message (call inside a transaction)."""
    lease.generation += 1
    lease.enqueued_at = timezone.now()
    lease.save(update_fields=["generation", "enqueued_at"])
    enqueue(DRAIN_TASK, lease.run_id, lease.slot, lease.generation)
    return lease


def concurrency_of(run: Run) -> int:
    """Leases per run: the policy's workers; one for a slice run (its lowest concurrency).
    How many of them run a chunk transaction at once is the guard's latency controller's to
    say (its setting is the count of the policy's ceiling slots a chunk may take,
    runs.engine.guard): a lease over it waits for a slot."""
    return 1 if run.rollout == "slice" else run.policy_version.parsed.policy_workers


@transaction.atomic
def ensure_leases(run: Run, *, stale_after_s: float | None = None) -> int:
    """Make sure each of the run's slots has a live lease; return how many were published.

    A slot is (re)published when it has no lease yet or, with ``stale_after_s``, when
    neither its message was enqueued nor its worker reported within that time.
    """
    published = 0
    now = timezone.now()
    slots = concurrency_of(run)
    # the slots' leases in one statement, locked in slot order; a missing one is made below
    held = Lease.objects.select_for_update().filter(run=run, slot__lt=slots).order_by("slot")
    leases = {lease.slot: lease for lease in held}
    for slot in range(slots):
        lease, created = leases.get(slot), False
        if lease is None:
            lease, created = Lease.objects.select_for_update().get_or_create(run=run, slot=slot)
        if created:
            publish(lease)
            published += 1
            continue
        if stale_after_s is None:
            continue
        last_sign = max(filter(None, [lease.enqueued_at, lease.heartbeat_at]))
        if (now - last_sign).total_seconds() > stale_after_s:
            publish(lease)
            published += 1
    return published


@transaction.atomic
def republish_all(run: Run) -> int:
    """Publish a fresh generation for every slot (after a pause, a kill switch, a replay)."""
    count = 0
    for slot in range(concurrency_of(run)):
        lease, _ = Lease.objects.select_for_update().get_or_create(run=run, slot=slot)
        publish(lease)
        count += 1
    return count


@transaction.atomic
def continue_lease(run_id: int, slot: int, generation: int) -> bool:
    """At the end of a lease's budget: publish its next generation if it is still current."""
    lease = Lease.objects.select_for_update().filter(run_id=run_id, slot=slot).first()
    if lease is None or lease.generation != generation:
        return False
    publish(lease)
    return True
