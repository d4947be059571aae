"""Runs across targets: one run per (policy, target, period), found by its key, drained where
it lives, its state read from that target's ledger (the record) or — when the target does not
answer — said to need attention, naming the target."""

from __future__ import annotations

from datetime import datetime

from django.db import DatabaseError

from core.oplog import ActionError
from core.roles import roles_of
from retention.models import Policy
from runs import actions
from runs.engine.errors import connection_lost
from runs.fleet import mirror
from runs.models import Run
from targets import connections as C
from targets.models import DEFAULT, Target

KEY_SEPARATOR = ":"


def target_of_key(key: str) -> str:
    """The target a run key names (``runs.actions.run_key_for``: ``payments:events/…``; a key
    without a target's name is the control database's)."""
    head, sep, _rest = key.partition(KEY_SEPARATOR)
    if sep and C.valid_name(head) and "/" not in head and head != DEFAULT:
        return head
    return DEFAULT


def targets_of(policy: Policy) -> list[str]:
    version = policy.approved_version
    names = version.parsed.targets if version is not None else (DEFAULT,)
    return C.resolve(names)


def ledger_problem(name: str) -> str:
    """'' when target ``name`` answers and holds the ledger; else one line saying why not."""
    if name == DEFAULT:
        return ""
    try:
        with C.on(name):
            if not C.has_ledger():
                return (
                    f"target {name} has no ledger: run `retention target migrate {name}` with"
                    " its owner login first"
                )
    except C.TargetError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a connection failure, shown as one line
        C.note_reachable(name, exc)
        return f"target {name} is unreachable: {C.first_line(exc)}"
    return ""


def trigger_everywhere(
    policy: Policy, *, tick: datetime, source: str = "schedule", actor="scheduler"
) -> list[tuple[str, Run | None, str]]:
    """The period's run on every target of the policy: [(target, run, note)] — run None and a
    note for a target that does not answer now. A target without the ledger refuses the whole
    trigger (one line; nothing is created anywhere)."""
    names = targets_of(policy)
    if names == [DEFAULT]:
        run, created = actions.trigger_run(policy, tick=tick, source=source, actor=actor)
        return [(DEFAULT, run, "created" if created else "existing")]
    if not isinstance(actor, str):
        roles_of(actor)  # read on the control database, remembered on the person
    problems = {name: ledger_problem(name) for name in names}
    missing = [p for p in problems.values() if "has no ledger" in p or "no target" in p]
    if missing:
        raise ActionError(missing[0])
    out: list[tuple[str, Run | None, str]] = []
    for name in names:
        if problems[name]:
            out.append((name, None, problems[name]))
            continue
        if name == DEFAULT:
            run, created = actions.trigger_run(policy, tick=tick, source=source, actor=actor)
        else:
            try:
                mirror.sync(name)
                with C.on(name):
                    here = Policy.objects.get(pk=policy.pk)
                    run, created = actions.trigger_run(here, tick=tick, source=source, actor=actor)
            except DatabaseError as exc:
                if not connection_lost(exc):
                    raise
                C.close_all()
                C.note_reachable(name, exc)
                out.append((name, None, f"target {name} is unreachable: {C.why_unusable(exc)}"))
                continue
            C.note_reachable(name, None)
        out.append((name, run, "created" if created else "existing"))
    return out


def find(key: str) -> tuple[str, Run | None]:
    """(target, run) of a run key; run None when the target does not answer."""
    name = target_of_key(key)
    if name != DEFAULT and not Target.objects.filter(name=name).exists():
        name = DEFAULT
    if name == DEFAULT:
        return DEFAULT, Run.objects.filter(run_key=key).first()
    try:
        with C.on(name):
            run = Run.objects.select_related("policy", "policy_version").filter(run_key=key).first()
    except C.TargetError:
        raise
    except Exception as exc:  # noqa: BLE001 - the target does not answer
        C.note_reachable(name, exc)
        return name, None
    return name, run


def unreachable_status(name: str, key: str) -> dict:
    """What ``status`` says of a run whose target does not answer: attention, naming it."""
    target = Target.objects.filter(name=name).first()
    since = target.unreachable_since.isoformat() if target and target.unreachable_since else ""
    why = (target.unreachable_reason if target else "") or "it does not answer"
    return {
        "run_key": key,
        "target": name,
        "state": Run.State.ATTENTION.value,
        "state_reason": (
            f"target {name} is unreachable{' since ' + since if since else ''}: {why}; the run"
            " resumes where it stopped when it answers again"
        ),
    }


def noted(name: str, data: dict) -> dict:
    """A run's status as its ledger says it, unless its target was last noted unusable — it
    answers reads but accepts no writes (a replica after a fail-over), so its active run cannot
    record that it is stuck: then ``attention``, naming the target and why."""
    why = attention_reason(name) if data.get("state") == Run.State.ACTIVE else ""
    if not why:
        return data
    return {
        **data,
        "state": Run.State.ATTENTION.value,
        "state_reason": f"{why}; the run resumes where it stopped when it accepts writes again",
    }


def attention_reason(name: str) -> str:
    """'' for a target that answered last time; else the attention its runs are in."""
    if name == DEFAULT:
        return ""
    target = Target.objects.filter(name=name).first()
    if target is None or target.unreachable_since is None:
        return ""
    return f"target {name} is unreachable: {target.unreachable_reason}"
