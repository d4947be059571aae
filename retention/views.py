from __future__ import annotations

from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from core.roles import require_role
from retention.models import LegalHold, Policy


@require_GET
@require_role()
def policy_list(request):
    return render(request, "retention/policy_list.html", {"policies": Policy.objects.all()})


@require_GET
@require_role()
def policy_detail(request, slug: str):
    policy = get_object_or_404(Policy, slug=slug)
    return render(
        request,
        "retention/policy_detail.html",
        {"policy": policy, "versions": policy.versions.select_related("author", "decided_by")},
    )


@require_GET
@require_role()
def holds(request):
    return render(
        request, "retention/holds.html", {"holds": LegalHold.objects.select_related("policy")}
    )
