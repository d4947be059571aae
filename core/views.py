from __future__ import annotations

import time

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_q.status import Stat

from core import docs
from core import tokens as api_tokens
from core.models import ApiToken
from core.reauth import require_recent_password
from core.roles import require_role


class LoginView(auth_views.LoginView):
    """Sign-in; throttled by django-axes (core.signin), which answers a locked attempt 429."""

    template_name = "registration/login.html"
    redirect_authenticated_user = True


@require_GET
@login_not_required
@never_cache
def healthz(request):
    """Database reachable, and how long ago each django-q2 cluster reported in."""
    body: dict = {"database": "ok", "clusters": {}}
    status = 200
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()
    except Exception as exc:  # the point of the endpoint is to report it
        body["database"] = f"error: {exc.__class__.__name__}"
        status = 503
    if status == 200:
        body["clusters"] = worker_heartbeats()
        ages = [c["heartbeat_age_s"] for c in body["clusters"].values()]
        body["worker_heartbeat_age_s"] = min(ages) if ages else None
    body["status"] = "ok" if status == 200 else "error"
    return JsonResponse(body, status=status)


def worker_heartbeats() -> dict:
    """Age of the newest heartbeat of each django-q2 cluster (from its shared-cache stat)."""
    now = time.time()
    clusters: dict = {}
    try:
        stats = Stat.get_all()
    except Exception:
        return clusters
    for stat in stats:
        name = getattr(stat, "cluster_id", None) or "cluster"
        age = round(now - stat.timestamp.timestamp(), 1) if stat.timestamp else None
        key = f"{getattr(stat, 'host', '')}:{name}"
        clusters[key] = {
            "heartbeat_age_s": age,
            "status": stat.status,
            "workers": len(stat.workers),
        }
    return clusters


@require_http_methods(["GET", "POST"])
@require_role()
@never_cache
def tokens(request):
    """Your personal API tokens: create one (its secret is shown once, on this response
    only), see when each was last used, revoke one. The CLI acts as you with it."""
    created = None
    status = 200
    if request.method == "POST":
        try:
            require_recent_password(request, "a new token")
            _, created = api_tokens.create_token(request.user, name=request.POST.get("name", ""))
        except PermissionDenied as exc:
            messages.error(request, str(exc))
            status = 403
        except api_tokens.TokenError as exc:
            messages.error(request, str(exc))
            status = 400
    return render(
        request,
        "core/tokens.html",
        {
            "tokens": ApiToken.objects.filter(user=request.user),
            "created": created,
            "token_env": "RETENTION_TOKEN",
        },
        status=status,
    )


@require_POST
@require_role()
def token_revoke(request, token_id: int):
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    try:
        api_tokens.revoke_token(token, actor=request.user)
        messages.success(request, f"token {token.prefix}… revoked")
    except api_tokens.TokenError as exc:
        messages.error(request, str(exc))
    return redirect("tokens")


@require_GET
def doc(request, name: str):
    """One of the docs folder's Markdown pages, read-only (``core.docs``)."""
    path = docs.available().get(name)
    if path is None:
        raise Http404(f"no page {name[:60]!r} in the docs")
    title, body = docs.render(path.read_text(encoding="utf-8"))
    return render(
        request,
        "core/doc.html",
        {"name": name, "title": title, "body": body, "pages": sorted(docs.available())},
    )
