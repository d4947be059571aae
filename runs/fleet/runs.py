"""Runs across targets: one run per (policy, target, period), found by its key, drained where
it lives, its state read from that target's ledger (the record) or — when the target does not
answer — said to need attention, naming the target."""

from __future__ import annotations

from datetime import datetime

from django.db import DatabaseError, InterfaceError, transaction

from core.oplog import ActionError
from core.roles import roles_of
from retention.models import Policy
from runs import actions
from runs.engine import reconciler
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

    def make(here: Policy) -> tuple[Run | None, str]:
        run, created = actions.trigger_run(here, tick=tick, source=source, actor=actor)
        return run, "created" if created else "existing"

    return on_each_target(policy, make, actor=actor, whole=True)


def catch_up_everywhere(policy: Policy, now: datetime) -> list[tuple[str, Run | None, str]]:
    """The reconciler's catch-up (``reconciler.catch_up``: one run for the newest missed tick,
    the older ones recorded on it) on every target of the policy, each judged by its own
    ledger's runs: [(target, run, note)], run None where nothing was missed or the target
    does not answer (the note says which)."""

    def make(here: Policy) -> tuple[Run | None, str]:
        run = reconciler.catch_up(here, now)
        return run, "caught up" if run is not None else "nothing to catch up"

    return on_each_target(policy, make, actor="reconciler")


def start_where_none(policy: Policy, *, tick: datetime, actor="startup"):
    """``retention startup``: a run for ``tick`` on every target of the policy where the policy
    has no run yet; [(target, run, note)], run None where it has one ("has runs") or the
    target does not answer."""

    def make(here: Policy) -> tuple[Run | None, str]:
        if Run.objects.filter(policy=here).exists():
            return None, "has runs"
        run, _created = actions.trigger_run(here, tick=tick, source="manual", actor=actor)
        return run, "started"

    return on_each_target(policy, make, actor=actor)


def on_each_target(
    policy: Policy, make, *, actor, whole: bool = False
) -> list[tuple[str, Run | None, str]]:
    """``make(policy)`` — which returns (run or None, note) — on each target of the policy, with
    the policy as that target's mirror holds it (synced first), inside a transaction of the
    target's. A target that does not answer or accept writes (a replica after a fail-over) is
    noted on its registry row and named, and the others go on. With ``whole`` a target without
    the ledger refuses all of it (``ActionError``), and any other error on one target stops the
    rest; otherwise each target is on its own: one that lacks the ledger, refuses
    (``ActionError``) or fails gets a note and the others go on."""
    names = C.targets_of(policy)
    if names == [DEFAULT]:
        return [(DEFAULT, *make(policy))]
    if not isinstance(actor, str):
        roles_of(actor)  # read on the control database, remembered on the person
    problems = {name: ledger_problem(name) for name in names}
    missing = [p for p in problems.values() if "has no ledger" in p or "no target" in p]
    if whole and missing:
        raise ActionError(missing[0])
    out: list[tuple[str, Run | None, str]] = []
    for name in names:
        if problems[name]:
            out.append((name, None, problems[name]))
            continue
        try:
            if name == DEFAULT:
                with transaction.atomic():
                    out.append((name, *make(policy)))
                continue
            mirror.sync(name)
            with C.on(name), transaction.atomic():
                out.append((name, *make(Policy.objects.get(pk=policy.pk))))
        except ActionError as exc:
            if whole:
                raise
            out.append((name, None, str(exc)))
            continue
        except (DatabaseError, InterfaceError) as exc:
            if name == DEFAULT:
                raise
            # a target that stopped answering or accepting writes (a replica after a
            # fail-over): noted, and the others get their runs
            lost = isinstance(exc, InterfaceError) or connection_lost(exc)
            if whole and not lost:
                raise
            C.close_all()
            if lost:
                C.note_reachable(name, exc)
                out.append((name, None, f"target {name} is unreachable: {C.why_unusable(exc)}"))
            else:
                out.append((name, None, f"target {name}: {C.first_line(exc)}"))
            continue
        C.note_reachable(name, None)
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
