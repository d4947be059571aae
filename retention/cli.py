"""``retention policy ...``, ``retention hold ...`` and ``retention floor ...`` sub-commands.

Every handler turns a refusal into one ``CommandError`` line; state changes act as the
authenticated person (``core.cli_identity.acting_user``: a personal API token) and go
through ``retention.actions``, so the CLI and the pages obey the same rules.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from django.core.management.base import CommandError
from django.db import transaction

from core.cli_identity import acting_user, one_line
from retention import actions, floors
from retention import plan as policies_as_code
from retention.holds import coverage as hold_coverage
from retention.models import LegalHold, Policy, PolicyVersion, RetentionFloor
from retention.periods import label as period_label
from retention.preview import live_preview, without_tenant_text
from retention.spec import did_you_mean, load_toml

CLAIM_HELP = "optional check: refused unless RETENTION_TOKEN belongs to this user"


def register(areas) -> None:
    """Add this app's sub-commands to the ``retention`` command's sub-parsers."""
    policy = areas.add_parser("policy", help="write, preview, approve and list policies")
    sub = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "apply",
        help="create a draft from a TOML file and submit it; given a directory, submit every "
        "policy file that differs from its approved version (exit 0 nothing to do, 2 changes "
        "submitted, 1 error)",
    )
    p.add_argument("file", metavar="FILE.toml|DIR")
    p.add_argument("--author", metavar="USERNAME", help=CLAIM_HELP)
    p.add_argument("--reason", default="", help="why this version is submitted (required)")
    p.set_defaults(handler=policy_apply)

    p = sub.add_parser(
        "plan",
        help="compare a directory of policy files with what is approved: per policy the "
        "difference and the preview (exit 0 nothing to do, 2 changes, 1 error)",
    )
    p.add_argument("dir", metavar="DIR")
    p.set_defaults(handler=policy_plan)

    p = sub.add_parser("approve", help="approve a submitted version")
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, required=True, metavar="N")
    p.add_argument("--approver", metavar="USERNAME", help=CLAIM_HELP)
    p.add_argument("--reason", default="")
    p.set_defaults(handler=policy_approve)

    p = sub.add_parser("reject", help="reject a submitted version")
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, required=True, metavar="N")
    p.add_argument("--approver", metavar="USERNAME", help=CLAIM_HELP)
    p.add_argument("--reason", required=True)
    p.set_defaults(handler=policy_reject)

    p = sub.add_parser("preview", help="dry-run the approved (else latest) version now")
    p.add_argument("slug")
    p.add_argument("--json", action="store_true", help="print the preview as JSON")
    p.set_defaults(handler=policy_preview)

    p = sub.add_parser("list", help="policies and the state of their versions")
    p.set_defaults(handler=policy_list)

    p = sub.add_parser("show", help="a version (the approved one unless --version) as a file")
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, metavar="N")
    p.add_argument("--toml", action="store_true", help="the policy file only")
    p.set_defaults(handler=policy_show)

    p = sub.add_parser(
        "pull",
        help="write each policy's approved version into DIR as SLUG.toml, so that the "
        "directory matches what was approved (then `policy plan DIR` reports no change)",
    )
    p.add_argument("dir", metavar="DIR")
    p.set_defaults(handler=policy_pull)

    for name, help_text in (("enable", "enable a policy"), ("disable", "disable a policy")):
        p = sub.add_parser(name, help=f"{help_text} (its schedule follows)")
        p.add_argument("slug")
        p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
        p.add_argument("--reason", required=True)
        p.set_defaults(handler=policy_enable if name == "enable" else policy_disable)

    for name, help_text in (
        ("pause", "stop admitting chunks of every run of a policy until resumed"),
        ("resume", "resume a paused policy"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("slug")
        p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
        p.add_argument("--reason", required=True)
        p.set_defaults(handler=policy_pause if name == "pause" else policy_resume)

    hold = areas.add_parser("hold", help="place, release and list legal holds")
    sub = hold.add_subparsers(dest="hold_command", required=True, metavar="COMMAND")

    p = sub.add_parser("place", help="place a legal hold")
    p.add_argument("--reason", required=True)
    p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
    p.add_argument("--policy", metavar="SLUG", help="default: all policies")
    p.add_argument(
        "--tenant", metavar="T", action="append",
        help="default: all tenants; once per part of a tenant of several columns, in order",
    )  # fmt: skip
    p.add_argument("--key-from", type=int, metavar="N")
    p.add_argument("--key-to", type=int, metavar="N")
    p.set_defaults(handler=hold_place)

    for name, handler, text in (
        ("release", hold_release, "request a hold's release (it stays in force until another "
         "member of compliance approves)"),
        ("approve-release", hold_approve_release, "approve a release another member of "
         "compliance requested: the hold is released"),
        ("withdraw-release", hold_withdraw_release, "withdraw your own release request"),
        ("refuse-release", hold_refuse_release, "refuse another member's release request"),
    ):  # fmt: skip
        p = sub.add_parser(name, help=text)
        p.add_argument("hold_id", type=int, metavar="ID")
        p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
        p.add_argument("--reason", required=True)
        p.set_defaults(handler=handler)

    p = sub.add_parser("list", help="active holds (--all: released ones too)")
    p.add_argument("--all", action="store_true")
    p.set_defaults(handler=hold_list)

    floor = areas.add_parser("floor", help="set, approve and list retention floors")
    sub = floor.add_subparsers(dest="floor_command", required=True, metavar="COMMAND")
    p = sub.add_parser("set", help="request a floor on a table (another officer approves)")
    p.add_argument("table", metavar="SCHEMA.TABLE")
    p.add_argument("period", metavar="PERIOD", help='e.g. "6 years"')
    p.add_argument("--mode", required=True, choices=("compliance", "governance"))
    p.add_argument("--reason", required=True)
    p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
    p.set_defaults(handler=floor_set)
    for name, handler, text in (
        ("approve", floor_approve, "approve a floor another member of compliance requested"),
        ("refuse", floor_refuse, "refuse (or withdraw) a requested floor"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("floor_id", type=int, metavar="ID")
        p.add_argument("--reason", required=True)
        p.add_argument("--by", metavar="USERNAME", help=CLAIM_HELP)
        p.set_defaults(handler=handler)
    p = sub.add_parser("list", help="every floor, newest first")
    p.set_defaults(handler=floor_list)


def _policy(slug: str) -> Policy:
    policy = Policy.objects.filter(slug=slug).first()
    if policy is None:
        near = did_you_mean(slug, Policy.objects.values_list("slug", flat=True))
        raise CommandError(f"unknown policy {slug!r}{near}")
    return policy


@one_line
def policy_show(command, options) -> None:
    """``policy show SLUG [--version N] [--toml]``: the version as its policy file; without
    ``--toml`` a comment line first says which version it is."""
    policy = _policy(options["slug"])
    if options.get("number"):
        version = _version(policy.slug, options["number"])
    else:
        version = policy.approved_version or policy.versions.order_by("-number").first()
        if version is None:
            raise CommandError(f"policy {policy.slug!r} has no version")
    if not options.get("toml"):
        command.stdout.write(
            f"# {policy.slug} v{version.number} ({version.state}), content hash "
            f"{version.content_hash}"
        )
    command.stdout.write(version.parsed.to_toml(), ending="")


@one_line
def policy_pull(command, options) -> None:
    """``policy pull DIR``: each approved version written as ``DIR/SLUG.toml``
    (``policies_as_code.pulled``); a file already equal is left as it is. Over the API the
    client sends the directory's files (``options["existing"]``) and writes those the
    answer carries (``options["files"]``)."""
    folder = Path(options["dir"])
    existing = options.get("existing")
    local = existing is None
    if local:
        if not folder.is_dir():
            raise CommandError(f"{folder} is not a directory")
        existing = dict(read_policy_dir(str(folder)))
    files = policies_as_code.pulled()
    options["files"] = []
    for name, text, version in files:
        same = existing.get(name) == text
        if not same:
            options["files"].append({"name": name, "toml": text})
            if local:
                (folder / name).write_text(text, encoding="utf-8")
        command.stdout.write(
            f"{folder / name}: {'already up to date' if same else 'written'} "
            f"({version.policy.slug} approved v{version.number})"
        )
    if not files:
        command.stdout.write("no approved policy to pull")


def _version(slug: str, number: int) -> PolicyVersion:
    version = PolicyVersion.objects.filter(policy__slug=slug, number=number).first()
    if version is None:
        raise CommandError(f"policy {slug!r} has no version {number}")
    return version


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def read_policy_dir(path: str) -> list[tuple[str, str]]:
    """The ``*.toml`` files of a directory (not its subdirectories), by name."""
    folder = Path(path)
    if not folder.is_dir():
        raise CommandError(f"{path} is not a directory")
    return [(p.name, _read(p)) for p in sorted(folder.glob("*.toml")) if p.is_file()]


@one_line
def policy_apply(command, options) -> int | None:
    if Path(options["file"]).is_dir():
        return apply_files(command, read_policy_dir(options["file"]), options)
    return apply_text(command, _read(Path(options["file"])), options)


def apply_text(command, text: str, options) -> None:
    """``policy apply FILE`` with the file's text (the API receives the text itself)."""
    spec = load_toml(text)
    author = acting_user(options)
    # One transaction: a draft that fails submission is not left behind.
    with transaction.atomic():
        version = actions.apply_spec(spec, author=author)
        if version.state == PolicyVersion.State.DRAFT:
            version = actions.submit_version(version, actor=author, reason=options["reason"])
    command.stdout.write(
        f"{version.policy.slug} v{version.number} {version.state} {version.content_hash}"
    )
    for warning in (version.validation or {}).get("warnings", []):
        command.stdout.write(f"warning: {warning}")
    if version.preview:
        command.stdout.write(_preview_summary(version.preview))


_LINE = re.compile(r"^line (\d+): ")


def file_error(name: str, error: str) -> str:
    """``events.toml:10: error: unknown key …`` — the file and line an error is about."""
    found = _LINE.match(error)
    if found:
        return f"{name}:{found.group(1)}: error: {error[found.end() :]}"
    return f"{name}: error: {error}"


@one_line
def policy_plan(command, options) -> int:
    return plan_files(command, read_policy_dir(options["dir"]), options)


def plan_files(command, files: list[tuple[str, str]], options) -> int:
    """``policy plan DIR`` with the directory's files; returns the exit code."""
    planned = policies_as_code.plan(files)
    write = command.stdout.write
    for item in planned:
        if item.error:
            write(file_error(item.file, item.error))
            continue
        if not item.changed:
            write(f"{item.slug}: no change (approved v{item.approved.number}, {item.file})")
            continue
        was = f"approved v{item.approved.number}" if item.approved else "new policy"
        pending = (
            f"; v{item.pending.number} {item.pending.state}, awaiting approval"
            if item.pending
            else ""
        )
        write(f"{item.slug}: change ({was} -> {item.file}{pending})")
        for row in item.diff:
            if item.approved is None:
                write(f"  + {row['field']} = {row['new']}")
            elif row["changed"]:
                write(f"  ~ {row['field']}: {row['old'] or '-'} -> {row['new'] or '-'}")
        if item.preview:
            write(f"  preview: {_preview_summary(item.preview)}")
            for period in item.preview.get("periods", [])[1:]:
                counted = f": {period['eligible']} eligible" if "eligible" in period else ""
                write(f"  period {period_label(period)}{counted}")
        elif item.preview_skipped:
            write(
                f"  preview: not taken (at most {policies_as_code.MAX_PLAN_PREVIEWS} per plan; "
                "plan fewer files at once)"
            )
    changes = sum(1 for item in planned if item.changed)
    errors = sum(1 for item in planned if item.error)
    write(
        f"plan: {changes} change(s), {len(planned) - changes - errors} unchanged"
        + (f", {errors} error(s)" if errors else "")
    )
    return policies_as_code.exit_code(planned)


def apply_files(command, files: list[tuple[str, str]], options) -> int:
    """``policy apply DIR`` with the directory's files: the changed policies submitted for a
    second person's approval, all or none; returns the exit code (2 when any was submitted
    now, 0 when there was nothing to submit)."""
    author = acting_user(options)
    planned = policies_as_code.plan(files, with_preview=False)
    write = command.stdout.write
    for item in planned:
        if item.error:
            write(file_error(item.file, item.error))
    if any(item.error for item in planned):
        raise CommandError("nothing was submitted: fix the file(s) above")
    submitted = policies_as_code.apply(planned, actor=author, reason=options["reason"])
    for item in planned:
        if not item.changed:
            write(f"{item.slug}: no change (approved v{item.approved.number})")
        elif item.pending in submitted:
            version = item.pending
            write(f"{item.slug} v{version.number} submitted {version.content_hash}")
            for warning in (version.validation or {}).get("warnings", []):
                write(f"warning: {warning}")
            if version.preview:
                write(f"  preview: {_preview_summary(version.preview)}")
        else:
            write(f"{item.slug} v{item.pending.number} already {item.pending.state}")
    write(
        f"apply: {len(submitted)} submitted for approval by another member of compliance, "
        f"{sum(1 for item in planned if item.changed) - len(submitted)} already submitted, "
        f"{sum(1 for item in planned if not item.changed)} unchanged"
    )
    return policies_as_code.EXIT_CHANGES if submitted else policies_as_code.EXIT_NOTHING


@one_line
def policy_approve(command, options) -> None:
    approver = acting_user(options)
    version = _version(options["slug"], options["number"])
    version = actions.approve_version(version, actor=approver, reason=options["reason"])
    command.stdout.write(
        f"{version.policy.slug} v{version.number} approved by {approver.username} "
        f"{version.approved_hash}"
    )


@one_line
def policy_enable(command, options) -> None:
    policy = actions.set_policy_enabled(
        _policy(options["slug"]),
        True,
        actor=acting_user(options),
        reason=options["reason"],
        expected=options.get("expected"),
    )
    command.stdout.write(f"policy {policy.slug} enabled")


@one_line
def policy_disable(command, options) -> None:
    policy = actions.set_policy_enabled(
        _policy(options["slug"]),
        False,
        actor=acting_user(options),
        reason=options["reason"],
        expected=options.get("expected"),
    )
    command.stdout.write(f"policy {policy.slug} disabled")


@one_line
def policy_pause(command, options) -> None:
    policy = actions.pause_policy(
        _policy(options["slug"]),
        actor=acting_user(options),
        reason=options["reason"],
        expected=options.get("expected"),
    )
    command.stdout.write(f"policy {policy.slug} paused: {policy.paused_reason}")


@one_line
def policy_resume(command, options) -> None:
    policy = actions.resume_policy(
        _policy(options["slug"]),
        actor=acting_user(options),
        reason=options["reason"],
        expected=options.get("expected"),
    )
    command.stdout.write(f"policy {policy.slug} resumed")


@one_line
def policy_reject(command, options) -> None:
    approver = acting_user(options)
    version = _version(options["slug"], options["number"])
    version = actions.reject_version(version, actor=approver, reason=options["reason"])
    command.stdout.write(f"{version.policy.slug} v{version.number} rejected by {approver.username}")


def preview_of(policy: Policy) -> dict:
    """The dry run of the policy's approved (else latest) version now, with its number."""
    version = policy.approved_version or policy.versions.order_by("-number").first()
    if version is None:
        raise CommandError(f"policy {policy.slug!r} has no version")
    result = dict(live_preview(version))
    result["version"] = version.number
    result["version_state"] = version.state
    return result


@one_line
def policy_preview(command, options) -> None:
    policy = _policy(options["slug"])
    write_preview(command, policy.slug, preview_of(policy), as_json=options["json"])


def write_preview(command, slug: str, result: dict, *, as_json: bool) -> None:
    if as_json:
        command.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    write = command.stdout.write
    write(f"{slug} v{result['version']} ({result['version_state']}) on {result['table']}")
    write(f"tick {result['tick']}  cutoff {result['cutoff']}")
    write(_preview_summary(result))
    if result.get("without_tenant"):
        write(without_tenant_text(result["without_tenant"]))
    for rule in result["kept_by_rule"]:
        write(f"  kept by {rule['rule']}: {rule['rows']}")
    for tenant in result["tenants"]:
        write(f"  tenant {tenant['tenant']}: {tenant['eligible']} eligible")
    if result["other_tenants"]:
        other = result["other_tenants"]
        write(f"  {other['tenants']} other tenants: {other['eligible']} eligible")
    for bucket in result["age_buckets"]:
        write(f"  {bucket['label']}: {bucket['eligible']}")
    write(f"sample keys: {', '.join(map(str, result['sample_keys'])) or '-'}")
    if result.get("partition_note"):
        write(result["partition_note"])
    for warning in result["warnings"]:
        write(f"warning: {warning}")
    if result["error"]:
        write(f"error: {result['error']}")


def _preview_summary(result: dict) -> str:
    stage = result.get("rollout") or "full"
    first = result["would"] if stage != "full" and result.get("would") else ""
    first = first or f"eligible {result['eligible']}"
    text = f"{first}, kept {result['kept']}, held {result['held']}, "
    if result["rows_per_second"] is None:  # nothing eligible: no time, no rate to quote
        text += "nothing to drain"
    else:
        text += (
            f"~{result['estimated_chunks']} chunks, drain ~{result['drain_seconds']} s "
            f"at {result['rows_per_second']} rows/s ({result['rate_source']})"
        )
    if result.get("error"):
        text += f" — {result['error']}"
    return text


@one_line
def policy_list(command, options) -> None:
    policies = Policy.objects.prefetch_related("versions")
    if not policies:
        command.stdout.write("no policies")
        return
    for policy in policies:
        versions = sorted(policy.versions.all(), key=lambda v: v.number)
        approved = next((v for v in versions if v.state == PolicyVersion.State.APPROVED), None)
        latest = versions[-1] if versions else None
        parts = [
            policy.slug,
            f"approved v{approved.number}" if approved else "not approved",
        ]
        if latest and latest is not approved:
            parts.append(f"latest v{latest.number} {latest.state}")
        parts.append("paused" if policy.paused else "enabled" if policy.enabled else "disabled")
        parts.append(f"'{policy.schedule}' {policy.timezone}")
        command.stdout.write("  ".join(parts))


@one_line
def hold_place(command, options) -> None:
    actor = acting_user(options)
    policy = _policy(options["policy"]) if options.get("policy") else None
    hold = actions.place_hold(
        actor=actor,
        reason=options["reason"],
        policy=policy,
        tenant=_tenant(options.get("tenant")),
        key_from=options.get("key_from"),
        key_to=options.get("key_to"),
    )
    options["hold_id"] = hold.pk  # what was placed, for a caller that runs this handler
    command.stdout.write(f"hold #{hold.pk} placed: {_scope(hold)}")
    _write_coverage(command, hold.coverage, hold)


def _hold(options) -> LegalHold:
    hold = LegalHold.objects.filter(pk=options["hold_id"]).first()
    if hold is None:
        raise CommandError(f"unknown hold #{options['hold_id']}")
    return hold


def _write_impact(command, impact) -> None:
    for item in impact:
        command.stdout.write(f"  {item.describe()}")


@one_line
def hold_release(command, options) -> None:
    actor = acting_user(options)
    hold = actions.request_hold_release(
        _hold(options), actor=actor, reason=options["reason"], expected=options.get("expected")
    )
    command.stdout.write(
        f"hold #{hold.pk}: release requested by {actor.username}; it stays in force until "
        f"another member of compliance approves (retention hold approve-release {hold.pk}). "
        "Once approved:"
    )
    _write_impact(command, hold.impact)


@one_line
def hold_approve_release(command, options) -> None:
    actor = acting_user(options)
    hold = actions.approve_hold_release(
        _hold(options), actor=actor, reason=options["reason"], expected=options.get("expected")
    )
    command.stdout.write(
        f"hold #{hold.pk} released by {hold.released_by} "
        f"(requested by {hold.release_requested_by}):"
    )
    _write_impact(command, hold.impact)


@one_line
def hold_withdraw_release(command, options) -> None:
    actor = acting_user(options)
    hold = actions.withdraw_hold_release(
        _hold(options), actor=actor, reason=options["reason"], expected=options.get("expected")
    )
    command.stdout.write(
        f"hold #{hold.pk}: release request withdrawn by {actor.username}; the hold stays in force"
    )


@one_line
def hold_refuse_release(command, options) -> None:
    actor = acting_user(options)
    hold = _hold(options)
    requester = hold.release_requested_by
    hold = actions.refuse_hold_release(
        hold, actor=actor, reason=options["reason"], expected=options.get("expected")
    )
    command.stdout.write(
        f"hold #{hold.pk}: release request{f' of {requester}' if requester else ''} refused by "
        f"{actor.username}; the hold stays in force"
    )


@one_line
def hold_list(command, options) -> None:
    holds = LegalHold.objects.select_related("policy").order_by("pk")
    if not options.get("all"):
        holds = holds.filter(released_at__isnull=True)
    if not holds:
        command.stdout.write("no holds")
        return
    for hold in holds:
        state = (
            f"released {hold.released_at:%Y-%m-%d %H:%M} by {hold.released_by}"
            + (f" (requested by {hold.release_requested_by})" if hold.release_requested_by else "")
            if hold.released_at
            else "active"
        )
        command.stdout.write(
            f"#{hold.pk}  {_scope(hold)}  {state}  placed {hold.placed_at:%Y-%m-%d %H:%M} "
            f"by {hold.placed_by}: {hold.reason}"
        )
        if hold.release_pending:
            command.stdout.write(
                f"  release requested by {hold.release_requested_by} "
                f"{hold.release_requested_at:%Y-%m-%d %H:%M}: {hold.release_request_reason} "
                "(awaiting another member of compliance)"
            )
        if hold.released_at is None:
            _write_coverage(command, hold_coverage(hold), hold)


def _tenant(values: list[str] | None):
    """``--tenant`` once: the tenant; several times: the parts of a tenant of several
    columns."""
    if not values:
        return None
    return values[0] if len(values) == 1 else list(values)


def _write_coverage(command, coverage, hold: LegalHold) -> None:
    if not coverage:
        command.stdout.write("  covers no policy with an approved version yet")
    for cover in coverage:
        command.stdout.write(f"  {cover.policy}: {cover.describe()}")
    if not hold.policy_id:
        command.stdout.write("  (a version approved later is checked against this hold)")
    for cover in coverage:
        if cover.warning():
            command.stdout.write(f"warning: {cover.warning()}")


def _scope(hold: LegalHold) -> str:
    parts = [f"policy {hold.policy.slug}" if hold.policy_id else "all policies"]
    parts.append(f"tenant {hold.tenant}" if hold.tenant is not None else "all tenants")
    if hold.key_from is not None or hold.key_to is not None:
        lo = "" if hold.key_from is None else hold.key_from
        hi = "" if hold.key_to is None else hold.key_to
        parts.append(f"keys [{lo}, {hi})")
    return ", ".join(parts)


def _floor(options) -> RetentionFloor:
    floor = RetentionFloor.objects.filter(pk=options["floor_id"]).first()
    if floor is None:
        raise CommandError(f"unknown floor #{options['floor_id']}")
    return floor


def _floor_line(floor: RetentionFloor) -> str:
    shown = floors.shown(floor)
    line = f"{floor.describe()} [{shown['state']}]"
    if shown["state"] == "waiting":
        line += f", in force from {floor.effective_at:%Y-%m-%d %H:%M} UTC"
    return line


@one_line
def floor_set(command, options) -> None:
    actor = acting_user(options)
    floor = actions.request_floor(
        options["table"], options["period"], mode=options["mode"], actor=actor,
        reason=options["reason"],
    )  # fmt: skip
    options["floor_id"] = floor.pk  # what was requested, for a caller that runs this handler
    lowers = f", lowering floor #{floor.replaces_id}" if floor.lowers else ""
    command.stdout.write(
        f"floor #{floor.pk} requested on {floor.qualified_table}: {floor.period}, {floor.mode} "
        f"mode, by {actor.username}{lowers}; in force once another member of compliance "
        f"approves (retention floor approve {floor.pk})"
    )


@one_line
def floor_approve(command, options) -> None:
    actor = acting_user(options)
    floor = actions.approve_floor(_floor(options), actor=actor, reason=options["reason"])
    command.stdout.write(f"floor #{floor.pk} approved by {actor.username}: {_floor_line(floor)}")


@one_line
def floor_refuse(command, options) -> None:
    actor = acting_user(options)
    floor = actions.refuse_floor(_floor(options), actor=actor, reason=options["reason"])
    command.stdout.write(f"floor #{floor.pk} refused by {actor.username}")


def floor_list(command, options) -> None:
    for floor in RetentionFloor.objects.all():
        command.stdout.write(_floor_line(floor))
