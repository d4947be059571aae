"""Runs (trigger, list, status, pause, resume, cancel, confirm, invariants check, manifest),
dead letters (list, replay, discard) and the global kill switch."""

from __future__ import annotations

from django.http import HttpResponse
from ninja import Query, Router

from core.filters import as_id
from core.roles import AUDITOR, COMPLIANCE, ONCALL
from retention.models import KillSwitch
from runs import cli as run_cli
from runs.evidence import cli_check, exports
from runs.fleet import runs as fleet_runs
from runs.models import DeadLetter, Run
from runs.status import run_status
from targets import connections as fleet_connections

from . import commands, schemas
from .auth import Token
from .errors import ApiError, not_found
from .fences import etag_of, if_match, tag
from .schemas import ERRORS

router = Router(tags=["runs"])


def run_or_404(key: str) -> Run:
    runs = Run.objects.select_related("policy", "policy_version")
    run = runs.filter(run_key=key).first()
    if run is None and as_id(key) is not None:
        run = runs.filter(pk=as_id(key)).first()
    if run is None:
        raise not_found(f"no run with key {key!r}")
    return run


def run_out(run: Run) -> dict:
    return {
        "run_key": run.run_key, "id": run.pk, "policy": run.policy.slug,
        "version": run.policy_version.number,
        **{f: getattr(run, f) for f in ("state", "state_reason", "tick", "cutoff", "rollout",
                                          "slice_bound", "created_by", "created_at", "finished_at")},
        "etag": etag_of(run),
    }  # fmt: skip


@router.get("/runs", response={200: list[schemas.RunOut], **ERRORS}, auth=Token())
def list_runs(request, policy: str = "", state: str = "", limit: int = 50):
    """The latest runs, newest first (``limit`` at most 500)."""
    runs = Run.objects.select_related("policy", "policy_version").order_by("-created_at", "-id")
    if policy:
        runs = runs.filter(policy__slug=policy)
    if state:
        runs = runs.filter(state=state)
    return [run_out(r) for r in runs[: max(1, min(limit, 500))]]


@router.post("/runs", response={200: schemas.Triggered, **ERRORS}, auth=Token(ONCALL))
def trigger(request, body: schemas.TriggerIn):
    """Create (or find) the run of a policy for a period (``retention trigger``); one run per
    policy and period however often it is asked."""
    output = commands.run(run_cli.trigger, slug=body.policy, period=body.period)
    first = output.stdout.split()[0]  # one key per target of the policy, one a line
    with fleet_connections.on(fleet_runs.target_of_key(first)):
        run = run_or_404(first)
        return {"output": output, "run_key": run.run_key, "etag": etag_of(run)}


def _control(name: str, handler, text: str):
    @router.post(f"/runs/{{path:key}}/{name}", response={200: schemas.Done, **ERRORS},
                 auth=Token(ONCALL), operation_id=f"run_{name}", summary=text)  # fmt: skip
    def endpoint(request, key: str, body: schemas.Reason):
        target = fleet_runs.target_of_key(key)  # the run lives in its target's ledger
        with fleet_connections.on(target):
            run = run_or_404(key)
        output = commands.run(
            handler, run_key=run.run_key, reason=body.reason, expected=if_match(request)
        )
        with fleet_connections.on(target):
            run.refresh_from_db()
            return {"output": output, "etag": etag_of(run)}

    endpoint.__doc__ = (
        f"{text} (``retention {name}``). ``If-Match``: the run's ETag the decision was made "
        "on; 412 ``stale_state`` when it moved on."
    )


_control("pause", run_cli._control("pause_run"), "Stop admitting chunks of a run")
_control("resume", run_cli._control("resume_run"), "Resume a paused run")
_control("cancel", run_cli._control("cancel_run"), "End a run; pending chunks are cancelled")
_control("confirm", run_cli._control("confirm_run"),
         "Start a run held for blast-radius confirmation")  # fmt: skip
_control("retry", run_cli._control("retry_run"),
         "Replay a run's dead letters of a run-level cause and resume it")  # fmt: skip


@router.post("/runs/{path:key}/check", response={200: commands.Output, **ERRORS},
             auth=Token(AUDITOR, COMPLIANCE))  # fmt: skip
def check(request, key: str, expect_drained: bool | None = None):
    """The run's invariants against its table and audit trail (``retention check``; with a
    shadow copy of the table it runs on the server only)."""
    run = run_or_404(key)
    return commands.run(cli_check.check, run_key=run.run_key, shadow=None,
                        expect_drained=expect_drained)  # fmt: skip


@router.get("/runs/{path:key}/manifest.json", auth=Token(AUDITOR, COMPLIANCE),
            response={200: dict, **ERRORS})  # fmt: skip
def manifest(request, key: str):
    """The run's evidence manifest (as the run page's download), read on the run's target."""
    name, found = fleet_runs.find(key)
    if name == fleet_connections.DEFAULT:
        return exports.manifest_response(run_or_404(key))
    if found is None:
        reason = fleet_runs.unreachable_status(name, key)["state_reason"]
        raise ApiError(409, "target_unreachable", reason)
    return exports.manifest_response(found, target=name)


# after every /runs/KEY/… route: a run key contains slashes (``events/2026-11-30T03:00``)
@router.get("/runs/{path:key}", response={200: schemas.RunStatus, **ERRORS}, auth=Token())
def status(request, response: HttpResponse, key: str, as_json: bool = Query(False, alias="json")):
    """State and progress of a run (``retention status``), with its ETag."""
    name, found = fleet_runs.find(key)
    if found is None and name != fleet_connections.DEFAULT:
        reason = fleet_runs.unreachable_status(name, key)["state_reason"]
        raise ApiError(409, "target_unreachable", reason)
    with fleet_connections.on(name):  # the run's own target: its ledger is the record
        run = run_or_404(key)
        data = fleet_runs.noted(name, {**run_status(run), "target": name})
        tag(response, etag_of(run))
        out = run_out(run)
    output = commands.run(lambda cmd, o: run_cli.write_status(cmd, data, as_json=as_json))
    return {"run": out, "status": data, "output": output}


@router.get("/dead-letters", response={200: list[schemas.DeadLetterOut], **ERRORS},
            auth=Token())  # fmt: skip
def dead_letters(request, open: bool = True):
    """Dead letters, newest first (``open``: only those not yet replayed or discarded)."""
    letters = DeadLetter.objects.select_related("run").order_by("-created_at", "-id")
    if open:
        letters = letters.filter(resolution=DeadLetter.Resolution.OPEN)
    return [
        {
            "id": d.pk, "run_key": d.run.run_key if d.run_id else None,
            **{f: getattr(d, f) for f in ("error_class", "sqlstate", "message", "attempts",
                                            "created_at", "resolution", "resolved_by",
                                            "resolved_at")},
        }
        for d in letters[:500]
    ]  # fmt: skip


@router.get("/listings/runs", response={200: commands.Output, **ERRORS}, auth=Token())
def runs_listing(request, policy: str = "", state: str = "", limit: int = 50):
    """The latest runs as the command line prints them (``retention runs``)."""
    return commands.run(run_cli.runs_list, policy=policy, state=state, limit=limit)


@router.get("/listings/dead-letters", response={200: commands.Output, **ERRORS}, auth=Token())
def dead_letters_listing(
    request, run: str = "", all: bool = False, cause: str = "", table: str = "", policy: str = ""
):
    """Dead letters as the command line prints them (``retention dead-letters [RUN]``)."""
    return commands.run(run_cli.dead_letters, run_key=run, all=all, cause=cause, table=table,
                        policy=policy)  # fmt: skip


def _bulk(name: str, handler, text: str):
    @router.post(f"/dead-letters/{name}", response={200: schemas.Done, **ERRORS},
                 auth=Token(ONCALL), operation_id=f"dead_letters_{name}", summary=text)  # fmt: skip
    def endpoint(request, body: schemas.BulkLetters):
        options = body.dict()
        return {"output": commands.run(handler, options)}

    endpoint.__doc__ = (
        f"{text} (``retention {name} ID…`` or ``--all``): the ``ids``, or with ``all`` every "
        "open dead letter matching ``run``, ``cause``, ``table`` and ``policy``; one reason, "
        "all or none, one operator-log row listing the ids."
    )


_bulk("replay", run_cli.replay, "Replay dead letters")
_bulk("discard", run_cli.discard, "Discard dead letters")


def _letter(name: str, handler, text: str):
    @router.post(f"/dead-letters/{{letter_id}}/{name}", response={200: schemas.Done, **ERRORS},
                 auth=Token(ONCALL), operation_id=f"dead_letter_{name}", summary=text)  # fmt: skip
    def endpoint(request, letter_id: int, body: schemas.Reason):
        if not DeadLetter.objects.filter(pk=letter_id).exists():
            raise not_found(f"no dead letter #{letter_id}")
        return {"output": commands.run(handler, id=letter_id, reason=body.reason)}

    endpoint.__doc__ = f"{text} (``retention {name}``)."


_letter("replay", run_cli.replay, "Replay a dead letter")
_letter("discard", run_cli.discard, "Discard a dead letter")


def _switch() -> KillSwitch:
    return KillSwitch.objects.filter(name="global").first() or KillSwitch(name="global")


@router.get("/kill-switch", response={200: schemas.KillSwitchOut, **ERRORS}, auth=Token())
def kill_switch(request, response: HttpResponse):
    switch = _switch()
    tag(response, etag_of(switch))
    return {"on": switch.on, "reason": switch.reason, "changed_by": switch.changed_by,
            "changed_at": switch.changed_at, "etag": etag_of(switch)}  # fmt: skip


@router.post("/kill-switch", response={200: schemas.Done, **ERRORS}, auth=Token(ONCALL))
def set_kill_switch(request, body: schemas.KillSwitchIn):
    """Flip the global kill switch (``retention kill-switch on|off``); ``If-Match``: the
    switch's ETag the decision was made on."""
    output = commands.run(
        run_cli.kill_switch, state=body.state, reason=body.reason, expected=if_match(request)
    )
    return {"output": output, "etag": etag_of(_switch())}
