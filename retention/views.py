"""Pages for policies, their versions and legal holds.

Thin function views: role check first, then a call into ``retention.actions``
(never a ``.save()`` here). A refusal from an action becomes a message on the
page it came from; the rule itself lives in the action, so the CLI obeys it too.
"""

from __future__ import annotations

import re

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch, Q
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from core.accounts import approver_refusal
from core.models import OperatorAction
from core.reauth import require_recent_password
from core.roles import COMPLIANCE, ONCALL, require_role, roles_of
from retention import actions, floors, signals
from retention.diff import spec_diff
from retention.holds import coverage, release_impact
from retention.models import LegalHold, Policy, PolicyVersion
from retention.preview import eligible_now, live_preview
from retention.spec import (
    FORM_FIELDS,
    FORM_KEEP_ROWS,
    KEEP_OPERATORS,
    LIST_OPERATORS,
    MAX_KEEP_RULES,
    MAX_POLICY_BYTES,
    NULLARY_OPERATORS,
    ROLLOUT_STAGES,
    SpecError,
    edited_toml,
    form_keep_rule,
    load_toml,
    toml_literal,
)

MAX_TOML_BYTES = MAX_POLICY_BYTES
REFUSALS = (SpecError, actions.ActionError, PermissionDenied)


def _refused(request, exc: Exception) -> None:
    messages.error(request, str(exc) or "not allowed")


def _version_or_404(slug: str, number: int) -> PolicyVersion:
    return get_object_or_404(
        PolicyVersion.objects.select_related("policy", "author", "submitted_by", "decided_by"),
        policy__slug=slug,
        number=number,
    )


def _with_bars(rows: list[dict], key: str = "eligible") -> list[dict]:
    """Add ``pct`` (0-100, relative to the largest row) for the CSS bar charts."""
    top = max((row.get(key) or 0 for row in rows), default=0)
    return [{**row, "pct": round(100 * (row.get(key) or 0) / top, 1) if top else 0} for row in rows]


def preview_context(result: dict | None) -> dict:
    if not result:
        return {"preview": None}
    tenants = list(result.get("tenants") or [])
    if result.get("other_tenants"):
        other = result["other_tenants"]
        tenants.append(
            {
                "tenant": f"{other['tenants']} others",
                "eligible": other["eligible"],
                "other": True,
            }
        )
    return {
        "preview": result,
        "tenant_bars": _with_bars(tenants),
        "age_bars": _with_bars(list(result.get("age_buckets") or [])),
        "rule_bars": _with_bars(list(result.get("kept_by_rule") or []), "rows"),
    }


# -- policies ----------------------------------------------------------------


@require_GET
@require_role()
@vary_on_headers("HX-Request")  # one URL serves the page and its HTMX fragment
def policy_list(request):
    """Every policy with its approved version and the newest version's state. With
    ``HX-Request`` only the table body comes back (the page polls it)."""
    policies = Policy.objects.prefetch_related(
        Prefetch("versions", queryset=PolicyVersion.objects.order_by("-number"))
    ).annotate(active_holds=Count("holds", filter=Q(holds__released_at__isnull=True)))
    rows = []
    for policy in policies:
        versions = list(policy.versions.all())
        approved = next((v for v in versions if v.state == PolicyVersion.State.APPROVED), None)
        rows.append(
            {
                "policy": policy,
                "approved": approved,
                "latest": versions[0] if versions else None,
                "pending": [v for v in versions if v.state == PolicyVersion.State.SUBMITTED],
            }
        )
    context = {"rows": rows}
    template = "retention/_policy_rows.html" if request.htmx else "retention/policy_list.html"
    return render(request, template, context)


@require_GET
@require_role()
def policy_detail(request, slug: str):
    return _policy_page(request, get_object_or_404(Policy, slug=slug))


def _policy_page(request, policy: Policy, *, form: dict | None = None, status: int = 200):
    versions = policy.versions.select_related("author", "decided_by").order_by("-number")
    approved = next((v for v in versions if v.state == PolicyVersion.State.APPROVED), None)
    base = approved or versions.first()
    return render(
        request,
        "retention/policy_detail.html",
        {
            "policy": policy,
            "versions": versions,
            "approved": approved,
            "holds": LegalHold.objects.filter(
                Q(policy=policy) | Q(policy__isnull=True), released_at__isnull=True
            ),
            "draft_toml": base.parsed.to_toml() if base else "",
            # a policy over other targets: its targets' runs load after the page (runs' fragment)
            "fleet_targets": list(approved.parsed.targets)
            if approved and tuple(approved.parsed.targets) != ("default",)
            else [],  # fmt: skip
            # each approved version's stage and its runs (runs registers the report)
            "rollout": signals.rollout_report(policy),
            "form": form or form_editor(base),
            # retention floors of the table, newest first (waiting: a lowering not yet in force)
            "floors": [
                floors.shown(f) for f in floors.of_table(base.parsed.schema, base.parsed.table)
            ]
            if base
            else [],  # fmt: skip
        },
        status=status,
    )


@require_GET
@require_role(COMPLIANCE)
def policy_new(request):
    return render(request, "retention/policy_new.html", {"toml": ""})


def _form_toml(data) -> str:
    """The policy file the form editor describes: the version it was filled from (``slug``,
    ``base``) with the common fields and keep rules it edits (``spec.edited_toml``)."""
    try:
        number = int(data.get("base", ""))
    except ValueError:
        raise SpecError("the form does not say which version it edits") from None
    base = PolicyVersion.objects.filter(policy__slug=data.get("slug", ""), number=number).first()
    if base is None:
        raise SpecError(f"no version {number} of policy {data.get('slug', '')!r} to edit")
    keep = []
    for n in range(MAX_KEEP_RULES + FORM_KEEP_ROWS):
        if f"keep-{n}-column" not in data:
            break
        rule = form_keep_rule(
            n + 1,
            data.get(f"keep-{n}-column", ""),
            data.get(f"keep-{n}-op", ""),
            data.get(f"keep-{n}-value", ""),
        )
        if rule is not None:
            keep.append(rule)
    fields = {name: data[name] for name in FORM_FIELDS if name in data}
    return edited_toml(base.parsed, fields, keep)


def form_editor(version: PolicyVersion | None, data=None, error: str = "") -> dict | None:
    """What the form editor shows, filled from ``version``: the common fields and one row per
    keep rule (its value as a policy file writes it), plus empty rows. With ``data`` (a
    refused form's POST) it shows what was typed, and ``error`` beside the field it names."""
    if version is None:
        return None
    if data is not None:
        rows = []
        for n in range(MAX_KEEP_RULES + FORM_KEEP_ROWS):
            if f"keep-{n}-column" not in data:
                break
            rows.append({k: data.get(f"keep-{n}-{k}", "") for k in ("column", "op", "value")})
        error, error_row = _keep_error(error, rows)
        return {
            "base": version,
            **{name: data.get(name, "") for name in FORM_FIELDS},
            "rollout_stages": ROLLOUT_STAGES,
            "keep": rows,
            "operators": KEEP_OPERATORS,
            "error": error,
            "error_field": _error_field(error),
            "error_row": error_row,
        }
    spec = version.parsed
    rows = [
        {
            "column": rule.column,
            "op": rule.op,
            "value": ""
            if rule.op in NULLARY_OPERATORS
            else toml_literal(rule.values if rule.op in LIST_OPERATORS else rule.value),
        }
        for rule in spec.keep
    ]
    rows += [{"column": "", "op": "", "value": ""}] * FORM_KEEP_ROWS
    return {
        "base": version,
        "name": spec.name,
        "retention": spec.retention,
        "schedule": spec.schedule,
        "chunk_size": spec.chunk_size,
        "rollout": spec.rollout,
        "slice": spec.slice or "",
        "rollout_stages": ROLLOUT_STAGES,
        "keep": rows,
        "operators": KEEP_OPERATORS,
    }


def _keep_error(error: str, rows: list[dict]) -> tuple[str, int | None]:
    """A refusal about a keep rule as the form's rows are labelled, and that row's index:
    the policy file counts the rules it holds from 0 (``keep[1]``), while the form counts
    its rows from 1, empty rows included ("keep rule 3"). (error, None) for any other."""
    typed = re.match(r"^(?:line \d+: )?keep rule (\d+)\b", error)
    if typed:
        return error, int(typed.group(1)) - 1
    found = re.search(r"\bkeep\[(\d+)\]", error)
    if found is None:
        return error, None
    filled = [n for n, r in enumerate(rows) if any(v.strip() for v in r.values())]
    index = int(found.group(1))
    if index >= len(filled):
        return error, None
    row = filled[index]
    return error[: found.start()] + f"keep rule {row + 1}" + error[found.end() :], row


def _error_field(error: str) -> str:
    """The form field a refusal names first ("retention must look like …": ``retention``;
    "keep rule 2: …": ``keep``), or "" when it names none of them."""
    error = re.sub(r"^line \d+: ", "", error)  # the policy file's line, which the form has not
    head = error.split(":", 1)[0].split(" ", 1)[0]
    if head in FORM_FIELDS:
        return head
    return "keep" if error.startswith("keep") else ""


def _refused_form(request, exc: Exception):
    """The policy page again, its form editor holding what was typed and the error beside
    its field (400): a bad value never takes the form away."""
    policy = Policy.objects.filter(slug=request.POST.get("slug", "")).first()
    try:
        number = int(request.POST.get("base", ""))
    except ValueError:
        number = None
    base = policy.versions.filter(number=number).first() if policy and number else None
    if base is None:
        _refused(request, exc)
        return render(request, "retention/policy_new.html", {"toml": ""}, status=400)
    return _policy_page(
        request, policy, form=form_editor(base, request.POST, str(exc) or "not allowed"),
        status=400,
    )  # fmt: skip


@require_POST
@require_role(COMPLIANCE)
def version_create(request):
    """Create a draft from pasted or uploaded TOML (the same parser as the CLI)."""
    upload = request.FILES.get("file")
    if upload is not None:
        if upload.size > MAX_TOML_BYTES:
            messages.error(request, f"the policy file is larger than {MAX_TOML_BYTES} bytes")
            return render(request, "retention/policy_new.html", {"toml": ""}, status=400)
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            messages.error(request, "the policy file is not UTF-8 text")
            return render(request, "retention/policy_new.html", {"toml": ""}, status=400)
    elif request.POST.get("editor") == "form":
        try:
            version = actions.apply_spec(load_toml(_form_toml(request.POST)), author=request.user)
        except REFUSALS as exc:
            return _refused_form(request, exc)
        messages.success(request, f"{version} is {version.state}")
        return redirect("retention:version_detail", slug=version.policy.slug, number=version.number)
    else:
        text = request.POST.get("toml", "")
    try:
        spec = load_toml(text)
        version = actions.apply_spec(spec, author=request.user)
    except REFUSALS as exc:
        _refused(request, exc)
        return render(request, "retention/policy_new.html", {"toml": text}, status=400)
    messages.success(request, f"{version} is {version.state}")
    return redirect("retention:version_detail", slug=version.policy.slug, number=version.number)


@require_POST
@require_role(ONCALL)
def policy_pause(request, slug: str):
    policy = get_object_or_404(Policy, slug=slug)
    try:
        actions.pause_policy(policy, actor=request.user, reason=request.POST.get("reason", ""))
        messages.success(request, f"policy {policy.slug} paused")
    except REFUSALS as exc:
        _refused(request, exc)
    return redirect("retention:policy_detail", slug=slug)


@require_POST
@require_role(ONCALL)
def policy_resume(request, slug: str):
    policy = get_object_or_404(Policy, slug=slug)
    try:
        actions.resume_policy(policy, actor=request.user, reason=request.POST.get("reason", ""))
        messages.success(request, f"policy {policy.slug} resumed")
    except REFUSALS as exc:
        _refused(request, exc)
    return redirect("retention:policy_detail", slug=slug)


# -- approvals ---------------------------------------------------------------


def previously_approved(version: PolicyVersion) -> PolicyVersion | None:
    """The version this one is compared against: the approved one while it is not approved
    itself; once approved, the one it superseded (so its diff stays visible)."""
    approved = PolicyVersion.objects.filter(
        policy_id=version.policy_id, state=PolicyVersion.State.APPROVED
    ).first()
    if approved and approved.pk != version.pk:
        return approved
    return (
        PolicyVersion.objects.filter(policy_id=version.policy_id, number__lt=version.number)
        .exclude(approved_hash="")
        .order_by("-number")
        .first()
    )


@require_GET
@require_role()
def approvals(request):
    """Every submitted version: those the signed-in member of compliance may decide on
    (someone else wrote and submitted them) first, with the submitter's reason, the changed
    fields against the approved version and the preview's count; then those waiting for
    someone else. Deciding goes through ``actions.approve_version`` / ``reject_version``."""
    submitted = list(
        PolicyVersion.objects.filter(state=PolicyVersion.State.SUBMITTED)
        .select_related("policy", "author", "submitted_by")
        .order_by("submitted_at", "id")
    )
    approved = {
        v.policy_id: v
        for v in PolicyVersion.objects.filter(
            policy_id__in=[v.policy_id for v in submitted], state=PolicyVersion.State.APPROVED
        )
    }
    reasons = dict(
        OperatorAction.objects.filter(
            action="version.submit",
            target_type="policyversion",
            target_id__in=[str(v.pk) for v in submitted],
        )
        .order_by("target_id", "at")
        .values_list("target_id", "reason")
    )  # the latest submit reason per version (a version is submitted once)
    mine, others = [], []
    now = timezone.now()
    for version in submitted:
        base = approved.get(version.policy_id)
        diff = spec_diff(base.parsed if base else None, version.parsed)
        # what each version would delete today, counted now on the same table: like with
        # like (the base's preview dates from before its own runs deleted its rows)
        eligible = eligible_now(version.parsed, version.policy_id, now)
        base_now = eligible_now(base.parsed, base.policy_id, now) if base else None
        row = {
            "version": version,
            "base": base,
            "changed": [r for r in diff if r["changed"]] if base else [],
            "reason": reasons.get(str(version.pk), ""),
            "eligible": (version.preview or {}).get("eligible"),
            "eligible_now": eligible,
            "base_eligible_now": base_now,
            "hand": version.hand_of(request.user),
            # the rollout step this version takes, and what the last count run found
            "step": (base.parsed.rollout if base else None, version.parsed.rollout),
            "rollout": signals.rollout_report(version.policy),
            # its other periods as submitted (with the rows each let go), and the floor in
            # force on its table: what approving it is measured against
            "periods": (version.preview or {}).get("periods", [])[1:],
            "floor": floors.in_force(version.parsed.schema, version.parsed.table),
            "below_floor": floors.violation(version.parsed),
        }
        (others if row["hand"] else mine).append(row)
    # a compliance grant that awaits a second superuser: this officer may not decide yet
    not_yet = approver_refusal(request.user)
    # hold releases requested and not yet decided: a second member of compliance approves
    # them like a version, so they wait in the same queue
    releases = list(
        LegalHold.objects.filter(released_at__isnull=True, release_requested_at__isnull=False)
        .select_related("policy")
        .order_by("release_requested_at", "id")
    )
    for hold in releases:
        hold.release_lines = [i.describe() for i in release_impact(hold)]
    return render(
        request,
        "retention/approvals.html",
        {
            "awaiting": mine,
            "own": others,
            "releases_awaiting": [h for h in releases if not _own_request(request, h)],
            "releases_own": [h for h in releases if _own_request(request, h)],
            "decider": COMPLIANCE in roles_of(request.user) and not not_yet,
            "not_yet": not_yet,
        },
    )


# -- versions ----------------------------------------------------------------


@require_GET
@require_role()
def version_detail(request, slug: str, number: int):
    """The version next to the approved one (field by field), its validation warnings and
    the preview taken at submission; the decision forms for compliance."""
    version = _version_or_404(slug, number)
    spec = version.parsed
    base = previously_approved(version)
    diff = spec_diff(base.parsed if base else None, spec)
    validation = version.validation or {}
    context = {
        "policy": version.policy,
        "version": version,
        "base": base,
        "diff": diff,
        "changed": sum(1 for row in diff if row["changed"]),
        "warnings": validation.get("warnings", []),
        "foreign_keys": validation.get("foreign_keys", []),
        "toml": spec.to_toml(),
        "hand": version.hand_of(request.user),
        "submit_reason": OperatorAction.objects.filter(
            action="version.submit", target_type="policyversion", target_id=str(version.pk)
        )
        .order_by("-at")
        .values_list("reason", flat=True)
        .first(),
        **preview_context(version.preview),
    }
    return render(request, "retention/version_detail.html", context)


def approved_comparison(version) -> dict | None:
    """What the policy's approved version (when it is another one) would delete if a run
    started now: the same ``live_preview`` as the candidate's, as bounded and cached (None
    when this is the approved version, or there is none). ``eligible`` is None when that
    preview did not finish; ``error`` says why."""
    approved = version.policy.versions.filter(state=PolicyVersion.State.APPROVED).first()
    if approved is None or approved.pk == version.pk:
        return None
    try:
        result = live_preview(approved)
    except SpecError as exc:
        return {
            "version": approved,
            "candidate": version.number,
            "eligible": None,
            "error": str(exc),
        }
    done = not result.get("error")
    return {
        "version": approved,
        "candidate": version.number,
        "eligible": result["eligible"] if done else None,
        "error": result.get("error"),
    }


@require_GET
@require_role(COMPLIANCE)
@vary_on_headers("HX-Request")  # one URL serves the page and its HTMX fragment
def version_preview(request, slug: str, number: int):
    """A fresh dry-run of this version as of now (HTMX fragment; not stored). Full-scan
    aggregates on the live table: compliance only, once per version and minute
    (``live_preview``)."""
    version = _version_or_404(slug, number)
    try:
        result = live_preview(version)
        error = None
    except SpecError as exc:
        result, error = None, str(exc)
    context = {
        "live": True,
        "live_error": error,
        "compare": approved_comparison(version),
        **preview_context(result),
    }
    if request.htmx:
        return render(request, "retention/_preview.html", context)
    return render(
        request,
        "retention/version_preview.html",
        {"policy": version.policy, "version": version, **context},
    )


def _decide(request, slug: str, number: int, action) -> HttpResponseRedirect:
    version = _version_or_404(slug, number)
    try:
        done = action(version)
        messages.success(request, f"{done} is {done.state}")
    except REFUSALS as exc:
        _refused(request, exc)
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)  # back to the approval queue the decision was made from
    return redirect("retention:version_detail", slug=slug, number=number)


@require_POST
@require_role(COMPLIANCE)
def version_submit(request, slug: str, number: int):
    reason = request.POST.get("reason", "")
    return _decide(
        request,
        slug,
        number,
        lambda v: actions.submit_version(v, actor=request.user, reason=reason),
    )


@require_POST
@require_role(COMPLIANCE)
def version_approve(request, slug: str, number: int):
    reason = request.POST.get("reason", "")

    def approve(version):
        require_recent_password(request, f"the approval of {version}")
        return actions.approve_version(version, actor=request.user, reason=reason)

    return _decide(request, slug, number, approve)


@require_POST
@require_role(COMPLIANCE)
def version_reject(request, slug: str, number: int):
    reason = request.POST.get("reason", "")
    return _decide(
        request,
        slug,
        number,
        lambda v: actions.reject_version(v, actor=request.user, reason=reason),
    )


# -- legal holds ---------------------------------------------------------------


@require_GET
@require_role()
def holds(request):
    all_holds = LegalHold.objects.select_related("policy")
    active = list(all_holds.filter(released_at__isnull=True))
    for hold in active:
        hold.coverage = coverage(hold)
    return render(
        request,
        "retention/holds.html",
        {
            "active": active,
            "released": all_holds.filter(released_at__isnull=False)[:100],
            "policies": Policy.objects.all(),
        },
    )


def _optional_int(value: str, name: str) -> int | None:
    value = (value or "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise actions.ActionError(f"{name} must be a whole number, got {value!r}") from None


@require_POST
@require_role(COMPLIANCE)
def hold_place(request):
    data = request.POST
    try:
        slug = data.get("policy", "").strip()
        policy = None
        if slug:
            policy = Policy.objects.filter(slug=slug).first()
            if policy is None:
                raise actions.ActionError(f"unknown policy {slug!r}")
        hold = actions.place_hold(
            actor=request.user,
            reason=data.get("reason", ""),
            policy=policy,
            tenant=data.getlist("tenant") or None,
            key_from=_optional_int(data.get("key_from", ""), "key from"),
            key_to=_optional_int(data.get("key_to", ""), "key to"),
        )
        covers = "; ".join(f"{c.policy}: {c.describe()}" for c in hold.coverage)
        messages.success(
            request,
            f"hold #{hold.pk} placed — covers "
            + (covers or "no policy with an approved version yet"),
        )
        for cover in hold.coverage:  # a hold that protects nothing is said so, with the way out
            if cover.warning():
                messages.warning(request, f"hold #{hold.pk} placed — but {cover.warning()}")
    except REFUSALS as exc:
        _refused(request, exc)
    return redirect(reverse("retention:holds"))


def _hold_or_404(hold_id: int) -> LegalHold:
    return get_object_or_404(LegalHold.objects.select_related("policy"), pk=hold_id)


@require_GET
@require_role()
def hold_detail(request, hold_id: int):
    """One hold: what it covers, who placed it, its release (requested, approved, withdrawn
    or refused: every step from the operator log) and, for compliance, the next step."""
    hold = _hold_or_404(hold_id)
    if hold.active:
        hold.coverage = coverage(hold)
    history = OperatorAction.objects.filter(
        target_type="legalhold", target_id=str(hold.pk)
    ).order_by("chain_seq")
    return render(
        request,
        "retention/hold_detail.html",
        {
            "hold": hold,
            "history": history,
            "own_request": hold.release_pending
            and hold.release_requested_by == request.user.username,
        },
    )


def _own_request(request, hold: LegalHold) -> bool:
    return hold.release_requested_by == request.user.username


# each release step: (action, confirmation page title, its button)
RELEASE_STEPS = {
    "request": (actions.request_hold_release, "Request the release of hold", "Request release"),
    "approve": (actions.approve_hold_release, "Approve the release of hold", "Release the hold"),
    "withdraw": (actions.withdraw_hold_release, "", ""),
    "refuse": (actions.refuse_hold_release, "", ""),
}


def _release_step(request, hold_id: int, step: str):
    """GET (request and approve): the confirmation — what the release will do, policy by
    policy (``holds.release_impact``: rows eligible at the next run, and when); POST: the
    step, fenced by the decision token the page was rendered with."""
    hold = _hold_or_404(hold_id)
    action, title, button = RELEASE_STEPS[step]
    if request.method == "GET":
        return render(
            request,
            "retention/hold_release_confirm.html",
            {
                "hold": hold,
                "step": step,
                "title": title,
                "button": button,
                "impact": [i.describe() for i in release_impact(hold)],
                "coverage": coverage(hold),
                "own_request": _own_request(request, hold),
            },
        )
    expected = request.POST.get("expected") or None
    try:
        if step == "approve" and hold.release_pending and not _own_request(request, hold):
            # releasing removes a protection: the password again, as for an approval
            require_recent_password(request, f"the release of hold #{hold.pk}")
        hold = action(
            hold, actor=request.user, reason=request.POST.get("reason", ""), expected=expected
        )
    except REFUSALS as exc:
        _refused(request, exc)
    else:
        done = {
            "request": "release requested; it stays in force until another member of "
            "compliance approves",
            "approve": f"released (requested by {hold.release_requested_by})",
            "withdraw": "release request withdrawn; the hold stays in force",
            "refuse": "release request refused; the hold stays in force",
        }[step]
        impact = "; ".join(i.describe() for i in getattr(hold, "impact", []))
        messages.success(request, f"hold #{hold.pk}: {done}" + (f" — {impact}" if impact else ""))
    return redirect(reverse("retention:hold_detail", args=[hold.pk]))


@require_http_methods(["GET", "POST"])
@require_role(COMPLIANCE)
def hold_release_request(request, hold_id: int):
    return _release_step(request, hold_id, "request")


@require_http_methods(["GET", "POST"])
@require_role(COMPLIANCE)
def hold_release_approve(request, hold_id: int):
    return _release_step(request, hold_id, "approve")


@require_POST
@require_role(COMPLIANCE)
def hold_release_withdraw(request, hold_id: int):
    return _release_step(request, hold_id, "withdraw")


@require_POST
@require_role(COMPLIANCE)
def hold_release_refuse(request, hold_id: int):
    return _release_step(request, hold_id, "refuse")
