"""The API's typed shapes (pydantic, through django-ninja): what scripts read and send."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from .commands import Output


class Error(Schema):
    code: str = Field(description="stable: unauthenticated, token_refused, forbidden, four_eyes, "
                      "not_found, stale_state, refused, invalid, invalid_request, command_failed, "
                      "password_required, throttled")  # fmt: skip
    message: str
    stdout: str | None = None
    stderr: str | None = None


ERRORS = {400: Error, 401: Error, 403: Error, 404: Error, 409: Error, 412: Error, 422: Error,
          429: Error}  # fmt: skip


class Reason(Schema):
    reason: str = Field("", description="why (kept in the operator log; most actions require it)")


class Done(Schema):
    """The outcome of a state change: the command line's text and the target's new ETag."""

    output: Output
    etag: str | None = None


class PolicyOut(Schema):
    slug: str
    name: str
    owner: str
    enabled: bool
    paused: bool
    paused_reason: str
    schedule: str
    timezone: str
    approved_version: int | None
    latest_version: int | None
    latest_state: str | None
    etag: str


class PolicyList(Schema):
    policies: list[PolicyOut]
    output: Output


class VersionOut(Schema):
    slug: str
    number: int
    state: str
    content_hash: str
    approved_hash: str
    author: str | None
    submitted_by: str | None
    submitted_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str
    spec: dict[str, Any]
    validation: dict[str, Any] | None
    preview: dict[str, Any] | None
    etag: str


class DiffRow(Schema):
    field: str
    old: str | None
    new: str | None
    changed: bool


class VersionDiff(Schema):
    slug: str
    number: int
    against: int | None = Field(description="the approved version compared with (none: new)")
    rows: list[DiffRow]


class PolicyText(Schema):
    toml: str = Field(description="a policy file's text (docs/policies.md)")
    reason: str = ""


class PolicyFile(Schema):
    name: str = Field(description="the file's name, e.g. events.toml")
    toml: str


class PolicyFiles(Schema):
    files: list[PolicyFile]
    reason: str = ""


class PullIn(Schema):
    dir: str = Field("", description="the directory's name, as the command line prints it")
    files: list[PolicyFile] = Field(default_factory=list, description="its policy files now")


class Pulled(Schema):
    output: Output
    files: list[PolicyFile] = Field(description="the files to write (those that differ)")


class Approval(Schema):
    reason: str = ""
    password: str = Field(
        "", description="the approver's password, asked again (sudo): a token alone cannot approve"
    )


class Switch(Schema):
    reason: str


class PreviewOut(Schema):
    version: int
    version_state: str
    preview: dict[str, Any]
    output: Output


class HoldOut(Schema):
    id: int
    policy: str | None
    tenant: str | None
    key_from: int | None
    key_to: int | None
    reason: str
    placed_by: str
    placed_at: datetime
    release_requested_by: str
    release_requested_at: datetime | None
    released_by: str
    released_at: datetime | None
    etag: str


class HoldList(Schema):
    holds: list[HoldOut]
    output: Output


class HoldIn(Schema):
    reason: str
    policy: str | None = Field(None, description="a policy's slug; none: every policy")
    tenant: list[str] | None = Field(
        None, description="none: every tenant; several parts for a tenant of several columns"
    )
    key_from: int | None = None
    key_to: int | None = None


class Placed(Done):
    id: int


class FloorOut(Schema):
    """A retention floor (docs/policies.md, "Per-tenant periods, classes and floors")."""

    id: int
    table: str
    period: str
    mode: Literal["compliance", "governance"]
    state: Literal["requested", "approved", "waiting", "refused"] = Field(
        description="waiting: approved, a governance lowering not yet in force (effective_at)"
    )
    lowers: bool
    requested_by: str
    requested_at: datetime
    request_reason: str
    approved_by: str | None
    approved_at: datetime | None
    effective_at: datetime | None


class FloorList(Schema):
    floors: list[FloorOut]
    output: Output


class FloorIn(Schema):
    table: str = Field(description="SCHEMA.TABLE")
    period: str = Field(description='the minimum retention, e.g. "6 years"')
    mode: Literal["compliance", "governance"]
    reason: str


class RunOut(Schema):
    run_key: str
    id: int
    policy: str
    version: int
    state: str
    state_reason: str
    tick: datetime
    cutoff: datetime
    rollout: Literal["count", "slice", "full"] = Field(
        description="count: counts what a full run would delete, deletes nothing; slice: "
        "deletes only rows older than slice_bound; full: everything eligible"
    )
    slice_bound: datetime | None = Field(None, description="a slice run's bound (cutoff − slice)")
    created_by: str
    created_at: datetime
    finished_at: datetime | None
    etag: str


class RunStatus(Schema):
    run: RunOut
    status: dict[str, Any]
    output: Output


class TriggerIn(Schema):
    policy: str = Field(description="the policy's slug")
    period: str | None = Field(None, description="YYYY-MM-DD or YYYY-MM-DDTHH:MM, policy's zone")


class Triggered(Done):
    run_key: str


class BulkLetters(Schema):
    ids: list[int] = Field(default_factory=list, description="dead letter ids")
    all: bool = Field(False, description="every open dead letter matching the filters")
    run: str = Field("", description="with all: a run key or id")
    cause: str = Field("", description="with all: a SQLSTATE (42703) or a whole cause")
    table: str = Field("", description="with all: orders or public.orders")
    policy: str = Field("", description="with all: a policy slug")
    reason: str = Field("", description="one reason for the batch")


class DeadLetterOut(Schema):
    id: int
    run_key: str | None
    error_class: str
    sqlstate: str
    message: str
    attempts: int
    created_at: datetime
    resolution: str
    resolved_by: str
    resolved_at: datetime | None


class KillSwitchOut(Schema):
    on: bool
    reason: str
    changed_by: str
    changed_at: datetime | None
    etag: str


class KillSwitchIn(Schema):
    state: Literal["on", "off"]
    reason: str


class Anchors(Schema):
    anchors: list[dict[str, Any]] = Field(
        default_factory=list, description="run manifests or checkpoints kept outside the database"
    )


class RoleChange(Schema):
    username: str
    role: Literal["compliance", "oncall", "auditor", "viewer"]
    reason: str = ""
    password: str = Field(
        "", description="the acting superuser's password, asked again: a token alone changes no one"
    )


class RolesOut(Schema):
    roles: dict[str, list[str]]
    superusers: list[str]
    output: Output


class UserIn(Schema):
    username: str
    password: str = Field(description="the new person's password")
    email: str = ""
    actor_password: str = Field(
        "", description="the acting superuser's password, asked again: a token alone creates no one"
    )


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class Me(Schema):
    username: str
    roles: list[str]
    token: str


class TargetOut(Schema):
    """A target database: its name, group and where its connection string comes from (a
    variable's name or a file's path — never the string)."""

    name: str
    group: str
    reference: str
    unreachable_since: datetime | None = None
    unreachable_reason: str = ""


class TargetList(Schema):
    targets: list[TargetOut]
    output: Output


class TargetIn(Schema):
    name: str
    dsn_env: str = Field("", description="the environment variable holding its URL, on the server")
    dsn_file: str = Field("", description="or the file holding its URL, on the server")
    group: str = ""
