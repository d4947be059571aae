"""Policies as code: a directory of policy files compared with what is approved (``plan``),
and the changed ones submitted for a second person's approval (``apply``).

A file is a change when its content differs from its policy's approved version (or the
policy is new). ``apply`` is idempotent: content equal to a version that is already a
draft, submitted or approved makes no new version (``actions.apply_spec``). Nothing is
submitted unless every file parses and validates, and every change is submitted in one
transaction: bad input changes nothing.

Exit codes for a pipeline (``EXIT_*``): 0 nothing to do, 2 changes (planned or submitted),
1 an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from retention import actions, floors, introspect
from retention.diff import spec_diff
from retention.models import Policy, PolicyVersion
from retention.preview import live_preview_of_spec
from retention.spec import PolicySpec, SpecError, load_toml, located

EXIT_NOTHING, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
# live previews in one plan (each bounded like the version page's, ``live_preview``); the
# changes past it are planned without one
MAX_PLAN_PREVIEWS = 10
State = PolicyVersion.State


@dataclass
class PlannedPolicy:
    file: str
    spec: PolicySpec | None = None
    policy: Policy | None = None
    approved: PolicyVersion | None = None
    pending: PolicyVersion | None = None  # a draft or submitted version of this content
    diff: list[dict] = field(default_factory=list)
    preview: dict | None = None
    preview_skipped: bool = False  # past ``MAX_PLAN_PREVIEWS``
    error: str = ""

    @property
    def slug(self) -> str:
        return self.spec.slug if self.spec else "?"

    @property
    def changed(self) -> bool:
        return not self.error and (
            self.approved is None or self.approved.content_hash != self.spec.content_hash()
        )

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "slug": self.slug if self.spec else None,
            "changed": self.changed,
            "approved_version": self.approved.number if self.approved else None,
            "pending_version": self.pending.number if self.pending else None,
            "pending_state": self.pending.state if self.pending else None,
            "diff": [row for row in self.diff if row["changed"] or self.approved is None],
            "preview": self.preview,
            "error": self.error or None,
        }


def pulled() -> list[tuple[str, str, PolicyVersion]]:
    """Each policy's approved version as a policy file: ``(SLUG.toml, text, version)`` by
    slug. Planning a directory of these reports no change (``load_toml(spec.to_toml())``
    is the same spec, with the same content hash)."""
    versions = PolicyVersion.objects.filter(state=State.APPROVED).select_related("policy")
    return sorted(
        ((f"{v.policy.slug}.toml", v.parsed.to_toml(), v) for v in versions),
        key=lambda item: item[0],
    )


def plan(files: list[tuple[str, str]], *, with_preview: bool = True) -> list[PlannedPolicy]:
    """Each ``(file name, TOML text)`` compared with its policy's approved version, in file
        order. A file that does not parse or validate, or a slug named twice, is an ``error``. The
    first ``MAX_PLAN_PREVIEWS`` changes get a live preview (``live_preview_of_spec``)."""
    planned: list[PlannedPolicy] = []
    seen: dict[str, str] = {}
    previews = 0
    for name, text in files:
        item = PlannedPolicy(file=name)
        planned.append(item)
        try:
            item.spec = load_toml(text)
            introspect.validate(item.spec)
            floors.check_version(item.spec)  # what apply would refuse, plan says
        except SpecError as exc:
            item.error = str(located(exc, text))
            continue
        except floors.FloorViolation as exc:
            item.error = str(exc)
            continue
        if item.spec.slug in seen:
            item.error = f"policy {item.spec.slug!r} is also in {seen[item.spec.slug]}"
            continue
        seen[item.spec.slug] = name
        item.policy = Policy.objects.filter(slug=item.spec.slug).first()
        item.approved = item.policy.approved_version if item.policy else None
        if not item.changed:
            continue
        item.diff = spec_diff(item.approved.parsed if item.approved else None, item.spec)
        item.pending = (
            item.policy.versions.filter(
                content_hash=item.spec.content_hash(), state__in=(State.DRAFT, State.SUBMITTED)
            )
            .order_by("-number")
            .first()
            if item.policy
            else None
        )
        if with_preview and previews < MAX_PLAN_PREVIEWS:
            previews += 1
            try:
                item.preview = live_preview_of_spec(
                    item.spec, policy_id=item.policy.pk if item.policy else None
                )
            except SpecError as exc:
                item.error = str(exc)
        elif with_preview:
            item.preview_skipped = True
    return planned


def exit_code(planned: list[PlannedPolicy]) -> int:
    if any(item.error for item in planned):
        return EXIT_ERROR
    return EXIT_CHANGES if any(item.changed for item in planned) else EXIT_NOTHING


@transaction.atomic
def apply(planned: list[PlannedPolicy], *, actor, reason: str) -> list[PolicyVersion]:
    """Submit every changed policy of ``planned`` (all of them, or none): a draft of its
    content, submitted for another member of compliance to approve. Returns the versions
    submitted now (a content already submitted is not submitted again)."""
    errors = [item for item in planned if item.error]
    if errors:
        raise SpecError(f"{errors[0].file}: {errors[0].error}")
    submitted = []
    for item in planned:
        if not item.changed:
            continue
        version = actions.apply_spec(item.spec, author=actor)
        if version.state == State.DRAFT:
            version = actions.submit_version(version, actor=actor, reason=reason)
            submitted.append(version)
        item.pending = version
    return submitted
