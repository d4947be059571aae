"""What retention tells the apps above it, without importing them (imports go one way).

``policy_decided`` is sent inside the transaction of a policy decision, after its state
change and operator-log row: ``runs`` follows it there (``runs.actions.follow_policy_decision``
re-arms the schedule, supersedes runs of an older version, restarts runs of a resumed or
re-enabled policy), so the consequences commit or roll back with the decision.

``preview_rate_sources``: functions ``slug -> rows per second per worker | None`` that the
dry-run preview asks for a measured rate (``runs`` registers the audit trail's).

``rollout_sources``: functions ``policy -> dict`` that tell the approval card and the policy
page what the policy's runs did at each rollout stage (``runs`` registers
``runs.counts.rollout_report``: the last count run's figures, the inflow two count runs show,
the rollout history).
"""

from __future__ import annotations

from collections.abc import Callable

from django.dispatch import Signal

# kwargs: policy, decision ("approved", "paused", "resumed", "enabled", "disabled"), actor,
# version (the approved version, for "approved")
policy_decided = Signal()

preview_rate_sources: list[Callable[[str], float | None]] = []

rollout_sources: list[Callable[[object], dict]] = []


def rollout_report(policy) -> dict | None:
    """The first registered rollout source's report of ``policy`` (None: no source)."""
    for source in rollout_sources:
        return source(policy)
    return None
