"""Keep one django-q2 cron Schedule per enabled policy, routed to the cleanup cluster."""

from __future__ import annotations


def sync_policy_schedule(policy) -> None:
    """Create, update or remove the policy's trigger schedule to match the policy."""
