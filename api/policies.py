"""Policies and their versions: list, show, diff, preview, apply/submit (one file or a
directory's worth: plan and apply), approve, reject, enable, disable, pause, resume."""

from __future__ import annotations

from django.http import HttpResponse
from ninja import Query, Router

from core.roles import COMPLIANCE, ONCALL
from retention import cli as policy_cli
from retention.diff import spec_diff
from retention.models import Policy, PolicyVersion

from . import commands, schemas
from .auth import Token, password_again
from .errors import ApiError, not_found
from .fences import etag_of, if_match, tag
from .schemas import ERRORS as ERRORS_DOC

router = Router(tags=["policies"])


def policy_or_404(slug: str) -> Policy:
    policy = Policy.objects.filter(slug=slug).first()
    if policy is None:
        raise not_found(f"no policy {slug!r}")
    return policy


def version_or_404(slug: str, number: int) -> PolicyVersion:
    version = (
        PolicyVersion.objects.select_related("policy", "author", "submitted_by", "decided_by")
        .filter(policy__slug=slug, number=number)
        .first()
    )
    if version is None:
        raise not_found(f"policy {slug!r} has no version {number}")
    return version


def version_etag(version: PolicyVersion) -> str:
    """A version's content never changes once written; what a decision acts on is its state
    and that content."""
    return f"{version.state}:{version.content_hash}"


def _name(user) -> str | None:
    return user.username if user else None


def policy_out(policy: Policy) -> dict:
    versions = sorted(policy.versions.all(), key=lambda v: v.number)
    approved = next((v for v in versions if v.state == PolicyVersion.State.APPROVED), None)
    latest = versions[-1] if versions else None
    return {
        **{f: getattr(policy, f) for f in ("slug", "name", "owner", "enabled", "paused",
                                            "paused_reason", "schedule", "timezone")},
        "approved_version": approved.number if approved else None,
        "latest_version": latest.number if latest else None,
        "latest_state": latest.state if latest else None,
        "etag": etag_of(policy),
    }  # fmt: skip


def version_out(version: PolicyVersion) -> dict:
    return {
        "slug": version.policy.slug,
        **{f: getattr(version, f) for f in ("number", "state", "content_hash", "approved_hash",
                                            "submitted_at", "decided_at", "decision_reason",
                                            "spec", "validation", "preview")},
        "author": _name(version.author),
        "submitted_by": _name(version.submitted_by),
        "decided_by": _name(version.decided_by),
        "etag": version_etag(version),
    }  # fmt: skip


@router.get("/policies", response={200: schemas.PolicyList, **ERRORS_DOC}, auth=Token())
def list_policies(request):
    """Every policy and the state of its versions (``retention policy list``)."""
    policies = Policy.objects.prefetch_related("versions")
    return {
        "policies": [policy_out(p) for p in policies],
        "output": commands.run(policy_cli.policy_list),
    }


@router.post("/policy-files/plan", response={200: commands.Output, **ERRORS_DOC},
             auth=Token(COMPLIANCE))  # fmt: skip
def plan(request, body: schemas.PolicyFiles):
    """Compare policy files with what is approved: per policy the difference and the
    preview (``retention policy plan DIR``); ``exit_code`` 0 nothing to do, 2 changes, 1
    an error. Compliance only (it reads the catalog and runs live previews): each preview
    bounded as the version page's, once per content and minute, at most
    ``retention.plan.MAX_PLAN_PREVIEWS`` per plan."""
    return commands.run(
        lambda command, options: policy_cli.plan_files(command, _files(body), options)
    )


@router.post("/policy-files/pull", response={200: schemas.Pulled, **ERRORS_DOC}, auth=Token())
def pull(request, body: schemas.PullIn):
    """Each policy's approved version as a policy file (``retention policy pull DIR``): the
    client sends the directory's files, the answer carries those that differ, to write."""
    options = {"dir": body.dir, "existing": {f.name: f.toml for f in body.files}}
    output = commands.run(policy_cli.policy_pull, options)
    return {"output": output, "files": options.get("files", [])}


@router.get("/policies/{slug}/file", response={200: commands.Output, **ERRORS_DOC}, auth=Token())
def show(request, slug: str, version: int | None = None, toml: bool = False):
    """A version (the approved one unless ``version``) as its policy file (``retention
    policy show SLUG [--version N] [--toml]``)."""
    return commands.run(policy_cli.policy_show, slug=slug, number=version, toml=toml)


@router.post(
    "/policy-files/apply", response={200: commands.Output, **ERRORS_DOC}, auth=Token(COMPLIANCE)
)
def apply(request, body: schemas.PolicyFiles):
    """Submit every file that differs from its approved version for another member of
    compliance to approve, all or none, idempotently (``retention policy apply DIR``);
    ``exit_code`` 0 nothing to do, 2 changes submitted."""
    return commands.run(
        lambda command, options: policy_cli.apply_files(command, _files(body), options),
        reason=body.reason,
    )


def _files(body: schemas.PolicyFiles) -> list[tuple[str, str]]:
    return [(f.name, f.toml) for f in body.files]


@router.post("/policies", response={200: schemas.Done, **ERRORS_DOC},
             auth=Token(COMPLIANCE))  # fmt: skip
def submit(request, body: schemas.PolicyText):
    """Create a draft from a policy file and submit it (``retention policy apply FILE``);
    content equal to an existing version makes no new one."""
    output = commands.run(
        lambda command, options: policy_cli.apply_text(command, body.toml, options),
        reason=body.reason,
    )
    return {"output": output}


@router.get("/policies/{slug}", response={200: schemas.PolicyOut, **ERRORS_DOC}, auth=Token())
def show_policy(request, response: HttpResponse, slug: str):
    """A policy and the state of its versions, with its ETag."""
    policy = policy_or_404(slug)
    tag(response, etag_of(policy))
    return policy_out(policy)


@router.get("/policies/{slug}/preview", response={200: schemas.PreviewOut, **ERRORS_DOC},
            auth=Token(COMPLIANCE))  # fmt: skip
def preview(request, slug: str, as_json: bool = Query(False, alias="json")):
    """Dry-run the approved (else latest) version now (``retention policy preview``):
    compliance only, computed at most once per version and minute (the version page's
    ``live_preview``; a stored preview is in the version's ``preview``)."""
    policy = policy_or_404(slug)
    result = policy_cli.preview_of(policy)
    output = commands.run(
        lambda command, options: policy_cli.write_preview(command, slug, result, as_json=as_json)
    )
    return {"version": result["version"], "version_state": result["version_state"],
            "preview": result, "output": output}  # fmt: skip


@router.get("/policies/{slug}/versions/{number}",
            response={200: schemas.VersionOut, **ERRORS_DOC}, auth=Token())  # fmt: skip
def show_version(request, response: HttpResponse, slug: str, number: int):
    version = version_or_404(slug, number)
    tag(response, version_etag(version))
    return version_out(version)


@router.get("/policies/{slug}/versions/{number}/diff",
            response={200: schemas.VersionDiff, **ERRORS_DOC}, auth=Token())  # fmt: skip
def diff(request, slug: str, number: int):
    """Field by field against the approved version (what an approver reviews)."""
    version = version_or_404(slug, number)
    approved = version.policy.approved_version
    rows = spec_diff(approved.parsed if approved else None, version.parsed)
    return {"slug": slug, "number": number, "against": approved.number if approved else None,
            "rows": rows}  # fmt: skip


def _fence_version(request, version: PolicyVersion) -> None:
    expected = if_match(request)
    if expected is not None and expected != version_etag(version):
        raise ApiError(
            412, "stale_state",
            f"{version} changed since it was read; it is now {version.state}. Nothing was "
            "changed: read it again and decide again",
        )  # fmt: skip


@router.post("/policies/{slug}/versions/{number}/approve",
             response={200: schemas.Done, **ERRORS_DOC}, auth=Token(COMPLIANCE))  # fmt: skip
def approve(request, slug: str, number: int, body: schemas.Approval):
    """Approve a submitted version: never its author's or submitter's (four eyes), with the
    approver's password (sudo). ``If-Match``: the version's ETag the approver reviewed."""
    version = version_or_404(slug, number)
    _fence_version(request, version)
    password_again(request, body.password, f"the approval of {version}")
    output = commands.run(policy_cli.policy_approve, slug=slug, number=number,
                          reason=body.reason)  # fmt: skip
    version.refresh_from_db()
    return {"output": output, "etag": version_etag(version)}


@router.post("/policies/{slug}/versions/{number}/reject",
             response={200: schemas.Done, **ERRORS_DOC}, auth=Token(COMPLIANCE))  # fmt: skip
def reject(request, slug: str, number: int, body: schemas.Reason):
    version = version_or_404(slug, number)
    _fence_version(request, version)
    output = commands.run(policy_cli.policy_reject, slug=slug, number=number,
                          reason=body.reason)  # fmt: skip
    version.refresh_from_db()
    return {"output": output, "etag": version_etag(version)}


def _switch(name: str, handler):
    @router.post(f"/policies/{{slug}}/{name}", response={200: schemas.Done, **ERRORS_DOC},
                 auth=Token(ONCALL), operation_id=f"policy_{name}")  # fmt: skip
    def endpoint(request, slug: str, body: schemas.Switch):
        policy_or_404(slug)
        output = commands.run(handler, slug=slug, reason=body.reason, expected=if_match(request))
        return {"output": output, "etag": etag_of(policy_or_404(slug))}

    endpoint.__doc__ = (
        f"{name.capitalize()} a policy (``retention policy {name}``). ``If-Match``: the "
        "policy's ETag the decision was made on; 412 ``stale_state`` when it moved on."
    )
    return endpoint


_switch("enable", policy_cli.policy_enable)
_switch("disable", policy_cli.policy_disable)
_switch("pause", policy_cli.policy_pause)
_switch("resume", policy_cli.policy_resume)
