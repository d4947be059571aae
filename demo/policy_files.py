"""The demo policies (``demo/policies/*.toml``): loading them, and submitting and
approving them through the product's own actions, as a compliance officer would."""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from retention.models import PolicyVersion
from retention.spec import PolicySpec

POLICY_DIR = Path(__file__).with_name("policies")
APPROVAL_REASON = "demo"


def policy_paths() -> list[Path]:
    return sorted(POLICY_DIR.glob("*.toml"))


# A demo policy archives under the project's own directory (``.archive/``, not committed):
# its file names the place as ``file://@PROJECT@/.archive/…``, written out here.
PROJECT = "@PROJECT@"
PROJECT_DIR = Path(__file__).resolve().parent.parent


def load_spec(path: Path) -> PolicySpec:
    """Parse one policy file; raises ``retention.spec.SpecError`` naming the problem. An
    ``[archive] to`` under ``@PROJECT@`` is the project's directory, created if missing."""
    text = path.read_text().replace(PROJECT, str(PROJECT_DIR))
    spec = PolicySpec.parse(tomllib.loads(text))
    if spec.archive_dir and spec.archive_dir.startswith(str(PROJECT_DIR)):
        Path(spec.archive_dir).mkdir(parents=True, exist_ok=True)
    return spec


def load_specs() -> list[PolicySpec]:
    return [load_spec(path) for path in policy_paths()]


@dataclass(frozen=True)
class Outcome:
    slug: str
    status: str  # "approved", "already approved", "failed" or "unavailable"
    detail: str = ""


REQUIRED_ACTIONS = ("apply_spec", "submit_version", "approve_version")


def _has_actions(module: ModuleType | None) -> bool:
    return module is not None and all(hasattr(module, name) for name in REQUIRED_ACTIONS)


def _actions() -> ModuleType | None:
    try:
        return importlib.import_module("retention.actions")
    except ImportError:
        return None


def apply_demo_policies(
    *, author, approver, actions: ModuleType | None = None, specs: list[PolicySpec] | None = None
) -> list[Outcome]:
    """Write (draft), submit and approve each demo policy: ``author`` writes and submits,
    ``approver`` approves, with the reason "demo".

    Idempotent: a policy whose approved version already has the file's content hash
    is left alone; an existing draft or submitted version with that hash is carried
    forward rather than written again. If ``retention.actions`` (or ``actions``) lacks
    ``apply_spec``, ``submit_version`` or ``approve_version``, nothing is done and every
    outcome is "unavailable". A failing policy does not stop the others.
    """
    State = PolicyVersion.State
    actions = actions if actions is not None else _actions()
    specs = load_specs() if specs is None else specs
    if not _has_actions(actions):
        return [Outcome(spec.slug, "unavailable") for spec in specs]
    outcomes = []
    for spec in specs:
        approved = PolicyVersion.objects.filter(
            policy__slug=spec.slug, content_hash=spec.content_hash(), state=State.APPROVED
        ).first()
        if approved is not None:
            outcomes.append(Outcome(spec.slug, "already approved", f"version {approved.number}"))
            continue
        try:
            version = actions.apply_spec(spec, author=author)
            if version.state == State.DRAFT:
                version = actions.submit_version(version, actor=author, reason="ready for review")
            if version.state != State.APPROVED:
                version = actions.approve_version(version, actor=approver, reason=APPROVAL_REASON)
        except Exception as exc:  # reported by the command, which then fails
            outcomes.append(Outcome(spec.slug, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        outcomes.append(Outcome(spec.slug, "approved", f"version {version.number}"))
    return outcomes
