"""What the overview page shows per policy: state, last run, progress, dead letters."""

from __future__ import annotations

from django.db.models import Count, Q

from retention.models import KillSwitch, Policy
from runs.models import DeadLetter, Run


def overview_context(request) -> dict:
    policies = list(Policy.objects.all())
    latest: dict[int, Run] = {}
    for run in Run.objects.order_by("policy_id", "-tick", "-id").distinct("policy_id"):
        latest[run.policy_id] = run
    dead = dict(
        DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN, run__isnull=False)
        .values_list("run__policy_id")
        .annotate(n=Count("id"))
    )
    rows = []
    for policy in policies:
        run = latest.get(policy.id)
        rows.append({"policy": policy, "run": run, "dead_letters": dead.get(policy.id, 0)})
    return {
        "policy_rows": rows,
        "kill_switch_on": KillSwitch.is_on(),
        "open_runs": Run.objects.filter(~Q(state__in=Run.TERMINAL)).count(),
    }
