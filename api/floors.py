"""Retention floors: list, show, request (``retention floor set``), and the second officer's
approval or refusal — the command line's handlers, with its roles and its refusals."""

from __future__ import annotations

from ninja import Router

from core.roles import COMPLIANCE
from retention import cli as policy_cli
from retention import floors
from retention.models import RetentionFloor

from . import commands, schemas
from .auth import Token
from .errors import not_found
from .schemas import ERRORS

router = Router(tags=["floors"])


def floor_or_404(floor_id: int) -> RetentionFloor:
    floor = RetentionFloor.objects.filter(pk=floor_id).first()
    if floor is None:
        raise not_found(f"unknown floor #{floor_id}")
    return floor


@router.get("/floors", response={200: schemas.FloorList, **ERRORS}, auth=Token())
def list_floors(request):
    """Every floor, newest first (``retention floor list``)."""
    return {
        "floors": [floors.shown(f) for f in RetentionFloor.objects.all()],
        "output": commands.run(policy_cli.floor_list),
    }


@router.post("/floors", response={200: schemas.Placed, **ERRORS}, auth=Token(COMPLIANCE))
def request_floor(request, body: schemas.FloorIn):
    """Request a floor on a table (``retention floor set``): in force once another member of
    compliance approves it. Lowering a governance floor takes a superuser's request; a
    compliance floor is never lowered (409 ``refused``)."""
    options = {"table": body.table, "period": body.period, "mode": body.mode,
               "reason": body.reason}  # fmt: skip
    output = commands.run(policy_cli.floor_set, options)
    return {"output": output, "id": options["floor_id"]}


@router.get("/floors/{floor_id}", response={200: schemas.FloorOut, **ERRORS}, auth=Token())
def show(request, floor_id: int):
    return floors.shown(floor_or_404(floor_id))


def _decision(name: str, handler, text: str):
    @router.post(f"/floors/{{floor_id}}/{name}", response={200: schemas.Done, **ERRORS},
                 auth=Token(COMPLIANCE), operation_id=f"floor_{name}", summary=text)  # fmt: skip
    def endpoint(request, floor_id: int, body: schemas.Reason):
        floor_or_404(floor_id)
        return {"output": commands.run(handler, floor_id=floor_id, reason=body.reason)}

    endpoint.__doc__ = f"{text} (``retention floor {name}``)."


_decision("approve", policy_cli.floor_approve,
          "Approve a floor another member of compliance requested")  # fmt: skip
_decision("refuse", policy_cli.floor_refuse, "Refuse (or withdraw) a requested floor")
