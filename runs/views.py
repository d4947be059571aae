from __future__ import annotations

from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from core.roles import AUDITOR, COMPLIANCE, require_role
from retention.models import OperatorAction
from runs.models import AuditRecord, DeadLetter, Run


@require_GET
@require_role()
def run_list(request):
    runs = Run.objects.select_related("policy", "policy_version")[:200]
    return render(request, "runs/run_list.html", {"runs": runs})


@require_GET
@require_role()
def run_detail(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("policy", "policy_version"), pk=run_id)
    return render(request, "runs/run_detail.html", {"run": run, "totals": run.chunk_totals()})


@require_GET
@require_role()
def dead_letters(request):
    letters = DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN).select_related(
        "run"
    )[:500]
    return render(request, "runs/dead_letters.html", {"letters": letters})


@require_GET
@require_role(AUDITOR, COMPLIANCE)
def audit(request):
    records = AuditRecord.objects.order_by("-chain_seq")[:200]
    return render(request, "runs/audit.html", {"records": records})


@require_GET
@require_role()
def activity(request):
    return render(request, "runs/activity.html", {"actions": OperatorAction.objects.all()[:500]})
