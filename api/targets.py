"""Targets: the databases the product deletes from (list, add, remove; docs/fleet.md). The
connection strings stay in the server's environment: an answer names only their source."""

from __future__ import annotations

from ninja import Router

from core.roles import ONCALL
from targets import cli as targets_cli
from targets.models import Target

from . import commands, schemas
from .auth import Token
from .schemas import ERRORS

router = Router(tags=["targets"])


def target_out(target: Target) -> dict:
    return {
        "name": target.name,
        "group": target.group,
        "reference": target.reference,
        "unreachable_since": target.unreachable_since,
        "unreachable_reason": target.unreachable_reason,
    }


@router.get("/targets", response={200: schemas.TargetList, **ERRORS}, auth=Token())
def list_targets(request):
    """The registered targets (``retention target list``: also whether each answers now and
    holds the ledger); the control database is the target ``default``."""
    return {
        "targets": [target_out(t) for t in Target.objects.all()],
        "output": commands.run(targets_cli.list_targets),
    }


@router.post("/targets", response={200: schemas.Done, **ERRORS}, auth=Token(ONCALL))
def add(request, body: schemas.TargetIn):
    """Register a target (``retention target add``): its URL is read on the server from
    ``dsn_env`` or ``dsn_file``, and the server must answer on it."""
    return {
        "output": commands.run(
            targets_cli.add,
            name=body.name,
            dsn_env=body.dsn_env,
            dsn_file=body.dsn_file,
            group=body.group,
        )
    }


@router.post("/targets/{name}/remove", response={200: schemas.Done, **ERRORS}, auth=Token(ONCALL))
def remove(request, name: str, body: schemas.Reason):
    """Forget a target (``retention target remove``); its ledger stays in its database."""
    return {"output": commands.run(targets_cli.remove, name=name, reason=body.reason)}
