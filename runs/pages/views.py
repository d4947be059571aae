"""Pages of runs, dead letters, audit evidence and the operator action log.

Every view checks the caller's role first (``core.roles``); every POST goes through an
action function of ``runs.actions``, which checks the role again, needs a reason and
writes the operator action log in the change's own transaction.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.db.models import CharField, Q
from django.db.models.functions import Cast
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from prometheus_client import CONTENT_TYPE_LATEST

from core.filters import QueryFilters, as_id
from core.models import OperatorAction
from core.roles import AUDITOR, COMPLIANCE, ONCALL, ROLE_DESCRIPTIONS, require_role, roles_of
from retention.models import KillSwitch, Policy, PolicyVersion
from retention.schedule_math import tick_for_period
from runs import actions
from runs.evidence import anchors, exports
from runs.evidence import fleet as fleet_evidence
from runs.fleet import view as fleet_view
from runs.models import DeadLetter, Run
from runs.pages.contexts import overview_context, policy_fleet_context, run_page_context
from runs.pages.metrics import render_metrics
from runs.progress import progress_for
from targets.models import Target

RUN_ACTIONS = {
    "pause": actions.pause_run,
    "resume": actions.resume_run,
    "cancel": actions.cancel_run,
    "confirm": actions.confirm_run,
    "retry": actions.retry_run,
}
LETTER_ACTIONS = {
    "replay": actions.replay_dead_letter,
    "discard": actions.discard_dead_letter,
}


def _back(request, default: str) -> HttpResponseRedirect:
    """Redirect to the form's ``next`` when it is a local URL, else to ``default``."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect(default)


def _filter_errors(request, read: QueryFilters) -> int:
    """Show each bad filter as an error message; the page's status (400 if any)."""
    for error in read.errors:
        messages.error(request, f"filter {error}")
    return 400 if read.errors else 200


def _perform(request, func, target, *, label: str) -> None:
    """Call an action with the posted reason; report the outcome as a message."""
    reason = request.POST.get("reason", "").strip()
    expected = request.POST.get("expected")  # the state the form was rendered for
    extra = {"expected": expected} if expected else {}
    try:
        func(target, actor=request.user, reason=reason, **extra)
    except actions.ActionError as exc:
        messages.error(request, f"{label} refused: {exc}")
    else:
        messages.success(request, f"{label}: done ({reason})")


@require_GET
@require_role()
def targets(request):
    return render(request, "runs/targets.html", fleet_view.targets_page())


@require_GET
@require_role()
def policy_fleet(request, slug: str):
    """A policy's targets, each with its latest run there (the fragment the policy's page
    loads after itself, the same one the overview shows in the policy's card)."""
    policy = get_object_or_404(Policy, slug=slug)
    return render(request, "runs/_policy_fleet.html", policy_fleet_context(policy))


@require_GET
@require_role()
def target(request, name: str):
    if name != "default" and not Target.objects.filter(name=name).exists():
        raise Http404(f"no target {name}")
    return render(request, "runs/target.html", fleet_view.target_page(name))


@require_GET
@require_role()
def run_list(request):
    runs = Run.objects.select_related("policy", "policy_version")
    read = QueryFilters(request.GET)
    policy = read.text("policy")
    state = read.choice("state", Run.State.values)
    key = read.text("q")
    if key:  # part of a run key: "events/2026-11"
        runs = runs.filter(run_key__icontains=key)
    if policy:
        runs = runs.filter(policy__slug=policy)
    if state:
        runs = runs.filter(state=state)
    status = _filter_errors(request, read)
    if status != 200:
        runs = runs.none()
    shown = list(runs[:200])
    # rows deleted per run: the one progress model, grouped queries for the whole page
    progress = progress_for(shown, now=timezone.now())
    return render(
        request,
        "runs/run_list.html",
        {
            "runs": [(run, progress[run.pk]) for run in shown],
            # an active run the kill switch stops is not shown as simply "active"
            "kill_switch_on": KillSwitch.is_on(),
            "policies": Policy.objects.values_list("slug", flat=True),
            "states": Run.State.choices,
            "policy_filter": policy,
            "state_filter": state,
            "key_filter": key,
        },
        status=status,
    )


@require_GET
@require_role()
@vary_on_headers("HX-Request")  # one URL serves the page and its HTMX fragment
def run_detail(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("policy", "policy_version"), pk=run_id)
    context = run_page_context(run)
    if request.htmx:
        return render(request, "runs/_run_live.html", context)
    context["anchor_status"] = anchors.status(anchors.latest_checkpoint())
    return render(request, "runs/run_detail.html", context)


@require_POST
@require_role(ONCALL)
def run_action(request, run_id: int, action: str):
    run = get_object_or_404(Run, pk=run_id)
    _perform(request, RUN_ACTIONS[action], run, label=f"{action.capitalize()} run {run.run_key}")
    return _back(request, reverse("runs:detail", args=[run.pk]))


@require_POST
@require_role(ONCALL)
def trigger(request):
    """Start (or find) the run of a policy for a period, like ``retention trigger --period``:
    the same tick rule and the same idempotent run key, so a second click lands on the same
    run. Goes through ``actions.trigger_run``."""
    slug = request.POST.get("policy", "").strip()
    policy = get_object_or_404(Policy, slug=slug)
    back = reverse("retention:policy_detail", args=[policy.slug])
    try:
        tick = tick_for_period(policy, request.POST.get("period"), timezone.now())
        run, created = actions.trigger_run(policy, tick=tick, source="manual", actor=request.user)
    except (ValueError, actions.ActionError) as exc:
        messages.error(request, f"Trigger refused: {exc}")
        return redirect(back)
    messages.success(
        request, f"Run {run.run_key} {'created' if created else 'already existed'} ({run.state})"
    )
    return redirect(reverse("runs:detail", args=[run.pk]))


@require_GET
@require_role()
def dead_letters(request):
    read = QueryFilters(request.GET)
    show = read.choice("show", ("open", "all"), default="open")
    letters = DeadLetter.objects.select_related(
        "run", "run__policy", "run__policy_version", "chunk"
    )
    if show != "all":
        letters = letters.filter(resolution=DeadLetter.Resolution.OPEN)
    filters = _letter_filters(read)
    letters = actions.filter_letters(letters, **filters).order_by("-created_at", "-id")
    status = _filter_errors(request, read)
    if status != 200:
        letters = letters.none()
    letters = list(letters[:500])
    for letter in letters:  # a chunk's bounds in its run's terms (an epoch timestamp's: instants)
        if letter.chunk is not None:
            letter.chunk.read_with(letter.run)
    return render(
        request,
        "runs/dead_letters.html",
        {
            "letters": letters,
            "show": show,
            "run_filter": read.text("run"),
            "policy_filter": filters["policy"],
            "cause_filter": filters["cause"],
            "table_filter": filters["table"],
            "matching": actions.open_letters_matching(**filters).count() if status == 200 else 0,
        },
        status=status,
    )


BULK_ACTIONS = {
    "replay": actions.replay_dead_letters,
    "discard": actions.discard_dead_letters,
}


def _letter_filters(read: QueryFilters) -> dict:
    """The dead-letter page's filters (run id, policy, cause, table) as
    ``actions.filter_letters`` takes them; a bad one is a filter error."""
    out: dict = {"run": None, "policy": read.text("policy"), "cause": read.text("cause"),
                 "table": read.text("table")}  # fmt: skip
    run = read.text("run")
    if run:
        run_id = as_id(run)
        if run_id is None:
            read.errors.append(f"run: must be a run id (a whole number), got {run[:40]!r}")
        else:
            out["run"] = Run.objects.filter(pk=run_id).first() or Run(pk=run_id)
    return out


@require_POST
@require_role(ONCALL)
def dead_letters_bulk(request):
    """Replay or discard, with one reason, all or none, on one operator-log row that lists
    the ids: the ticked letters, or (``scope=matching``) every open letter matching the
    page's filters (run, policy, cause, table)."""
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "").strip()
    func = BULK_ACTIONS.get(action)
    if request.POST.get("scope") == "matching":
        read = QueryFilters(request.POST)
        filters = _letter_filters(read)
        if read.errors:
            messages.error(request, f"Bulk action refused: {'; '.join(read.errors)}")
            return _back(request, reverse("runs:dead_letters"))
        letters = list(actions.open_letters_matching(**filters))
        ids = [letter.pk for letter in letters]
        if not letters:
            messages.error(request, f"Bulk {action} refused: no open dead letter matches")
            return _back(request, reverse("runs:dead_letters"))
    else:
        ids = [as_id(v) for v in request.POST.getlist("letter")]
        letters = list(DeadLetter.objects.filter(pk__in=[i for i in ids if i]).order_by("pk"))
    if func is None or not ids or None in ids:
        messages.error(
            request, "Bulk action refused: choose replay or discard and at least one letter"
        )
        return _back(request, reverse("runs:dead_letters"))
    try:
        if len(letters) != len(set(ids)):
            raise actions.ActionError("a chosen dead letter does not exist")
        func(letters, actor=request.user, reason=reason)
    except actions.ActionError as exc:
        messages.error(request, f"Bulk {action} refused, nothing changed: {exc}")
    else:
        messages.success(request, f"{action.capitalize()}: {len(letters)} dead letters ({reason})")
    return _back(request, reverse("runs:dead_letters"))


@require_POST
@require_role(ONCALL)
def dead_letter_action(request, letter_id: int, action: str):
    letter = get_object_or_404(DeadLetter, pk=letter_id)
    _perform(
        request,
        LETTER_ACTIONS[action],
        letter,
        label=f"{action.capitalize()} dead letter #{letter.pk}",
    )
    return _back(request, reverse("runs:dead_letters"))


@require_POST
@require_role(ONCALL)
def kill_switch(request):
    on = request.POST.get("on") == "1"
    reason = request.POST.get("reason", "").strip()
    try:
        actions.set_kill_switch(
            on, actor=request.user, reason=reason, expected=request.POST.get("expected") or None
        )
    except actions.ActionError as exc:
        messages.error(request, f"Kill switch unchanged: {exc}")
    else:
        messages.success(request, f"Global kill switch turned {'ON' if on else 'off'} ({reason})")
    return _back(request, reverse("home"))


@require_GET
@require_role(AUDITOR, COMPLIANCE)
def audit(request):
    filters = exports.AuditFilters.from_query(request.GET)
    records = list(exports.audit_queryset(filters).select_related(None)[:200])
    specs = {
        v.pk: v.parsed
        for v in PolicyVersion.objects.filter(pk__in={r.policy_version_id for r in records})
    }
    for record in records:  # bounds in each version's terms: an epoch timestamp's as instants
        record.read_with(specs[record.policy_version_id])
    return render(
        request,
        "runs/audit.html",
        {
            "records": records,
            "filters": filters,
            "query": request.GET.urlencode(),
            "policies": Policy.objects.values_list("slug", flat=True),
            "run": filters.run_obj(),
        },
        status=400 if filters.errors else 200,
    )


@require_GET
@require_role(AUDITOR, COMPLIANCE)
def audit_export(request):
    return exports.csv_response(exports.AuditFilters.from_query(request.GET))


@require_GET
@require_role(AUDITOR, COMPLIANCE)
def period_manifest(request, slug: str):
    """The evidence manifest of a policy's period (``?period=``; the latest without) over every
    target (``runs.evidence.fleet``), as the API and ``retention evidence --policy`` give it."""
    policy = get_object_or_404(Policy, slug=slug)
    read = QueryFilters(request.GET)
    text = read.text("period")
    try:
        tick = None if read.errors else tick_for_period(policy, text or None, timezone.now())
    except (ValueError, OverflowError) as exc:
        read.errors.append(f"period: {exc}")
    if read.errors:
        return HttpResponse(
            "; ".join(read.errors), status=400, content_type="text/plain; charset=utf-8"
        )
    return fleet_evidence.manifest_response(policy, tick)


@require_GET
@require_role(AUDITOR, COMPLIANCE)
def run_manifest(request, run_id: int):
    run = get_object_or_404(
        Run.objects.select_related(
            "policy", "policy_version", "policy_version__author", "policy_version__decided_by"
        ),
        pk=run_id,
    )
    return exports.manifest_response(run)


def _activity_run(read: QueryFilters) -> Run | None:
    """The ``run`` filter: a run id or a run key; an unknown one is a filter error."""
    text = read.text("run")
    if not text:
        return None
    run_id = as_id(text)
    run = Run.objects.filter(pk=run_id).first() if run_id else None
    run = run or Run.objects.filter(run_key=text).first()
    if run is None:
        read.errors.append(f"run: no run with id or key {text[:80]!r}")
    return run


def _target_labels(rows: list) -> dict[tuple[str, str], tuple[str, str]]:
    """(target type, id) → (label, URL) for the runs, versions, policies and legal holds on
    the page: one query per kind (none for holds), so a page of 500 actions costs three
    lookups."""
    ids: dict[str, set[int]] = {"run": set(), "policyversion": set(), "policy": set()}
    for row in rows:
        if row.target_type in ids and row.target_id.isdigit():
            ids[row.target_type].add(int(row.target_id))
    out = {}
    for run in Run.objects.filter(pk__in=ids["run"]).only("id", "run_key"):
        out["run", str(run.pk)] = (run.run_key, reverse("runs:detail", args=[run.pk]))
    for v in PolicyVersion.objects.filter(pk__in=ids["policyversion"]).select_related("policy"):
        url = reverse("retention:version_detail", args=[v.policy.slug, v.number])
        out["policyversion", str(v.pk)] = (f"{v.policy.slug} v{v.number}", url)
    for p in Policy.objects.filter(pk__in=ids["policy"]).only("id", "slug"):
        out["policy", str(p.pk)] = (p.slug, reverse("retention:policy_detail", args=[p.slug]))
    for row in rows:  # a hold's page needs no lookup: its id is the link
        if row.target_type == "legalhold" and row.target_id.isdigit():
            url = reverse("retention:hold_detail", args=[int(row.target_id)])
            out["legalhold", row.target_id] = (f"hold #{row.target_id}", url)
    return out


@require_GET
@require_role()
def activity(request):
    read = QueryFilters(request.GET)
    actor = read.text("actor")
    action = read.text("action")
    rows = OperatorAction.objects.all()
    if actor:
        rows = rows.filter(actor=actor)
    if action:
        rows = rows.filter(action=action)
    run = _activity_run(read)
    if run is not None:
        rows = rows.filter(target_type="run", target_id=str(run.pk))
    slug = read.text("policy")
    policy = Policy.objects.filter(slug=slug).first() if slug else None
    if slug and policy is None:
        read.errors.append(f"policy: no policy named {slug[:80]!r}")
    if policy is not None:  # the policy itself, its versions and its runs
        as_text = Cast("pk", CharField())
        rows = rows.filter(
            Q(target_type="policy", target_id=str(policy.pk))
            | Q(
                target_type="policyversion",
                target_id__in=PolicyVersion.objects.filter(policy=policy)
                .annotate(t=as_text)
                .values("t"),
            )
            | Q(
                target_type="run",
                target_id__in=Run.objects.filter(policy=policy).annotate(t=as_text).values("t"),
            )
        )
    status = _filter_errors(request, read)
    if status != 200:
        rows = rows.none()
    page = list(rows[:500])
    labels = _target_labels(page)
    for row in page:
        row.target_label, row.target_url = labels.get(
            (row.target_type, row.target_id), (f"{row.target_type} {row.target_id}", "")
        )
    distinct = OperatorAction.objects.order_by()
    return render(
        request,
        "runs/activity.html",
        {
            "actions": page,
            "actors": distinct.values_list("actor", flat=True).distinct().order_by("actor"),
            "action_names": distinct.values_list("action", flat=True).distinct().order_by("action"),
            "policies": Policy.objects.order_by("slug").values_list("slug", flat=True),
            "actor_filter": actor,
            "action_filter": action,
            "run_filter": read.text("run"),
            "policy_filter": slug,
        },
        status=status,
    )


# ---------------------------------------------------------------- /metrics


def _bearer_ok(request) -> bool:
    expected = getattr(settings, "METRICS_TOKEN", "") or ""
    header = request.headers.get("Authorization", "")
    if not expected or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), expected.encode())


@require_GET
@login_not_required
@never_cache
def metrics_view(request):
    """Allowed for a signed-in user with any role, or with ``Authorization: Bearer $METRICS_TOKEN``."""
    if not (roles_of(request.user) or _bearer_ok(request)):
        status = 403 if request.user.is_authenticated else 401
        response = HttpResponse("metrics need a role or a bearer token\n", status=status)
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)


@require_GET
@require_role()
@vary_on_headers("HX-Request")  # one URL serves the page and its HTMX fragment
def home(request):
    context = {
        "my_roles": [(role, ROLE_DESCRIPTIONS[role]) for role in sorted(roles_of(request.user))],
        **overview_context(request),
    }
    template = "runs/_overview.html" if request.htmx else "runs/overview.html"
    return render(request, template, context, status=400 if context["filter_errors"] else 200)
