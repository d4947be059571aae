"""Legal holds: list, show, place, and the two-person release (request, approve, withdraw,
refuse)."""

from __future__ import annotations

from django.http import HttpResponse
from ninja import Router

from core.roles import COMPLIANCE
from retention import cli as policy_cli
from retention.models import LegalHold

from . import commands, schemas
from .auth import Token, password_again
from .errors import not_found
from .fences import etag_of, if_match, tag
from .schemas import ERRORS

router = Router(tags=["holds"])


def hold_or_404(hold_id: int) -> LegalHold:
    hold = LegalHold.objects.select_related("policy").filter(pk=hold_id).first()
    if hold is None:
        raise not_found(f"unknown hold #{hold_id}")
    return hold


def hold_out(hold: LegalHold) -> dict:
    return {
        "id": hold.pk,
        "policy": hold.policy.slug if hold.policy_id else None,
        **{f: getattr(hold, f) for f in ("tenant", "key_from", "key_to", "reason", "placed_by",
                                          "placed_at", "release_requested_by",
                                          "release_requested_at", "released_by", "released_at")},
        "etag": etag_of(hold),
    }  # fmt: skip


@router.get("/holds", response={200: schemas.HoldList, **ERRORS}, auth=Token())
def list_holds(request, all: bool = False):
    """Active holds with what each covers now (``all``: released ones too;
    ``retention hold list``)."""
    holds = LegalHold.objects.select_related("policy").order_by("pk")
    if not all:
        holds = holds.filter(released_at__isnull=True)
    return {
        "holds": [hold_out(h) for h in holds],
        "output": commands.run(policy_cli.hold_list, all=all),
    }


@router.post("/holds", response={200: schemas.Placed, **ERRORS}, auth=Token(COMPLIANCE))
def place(request, body: schemas.HoldIn):
    """Place a legal hold (``retention hold place``); effective for every deletion that
    commits after it."""
    options = {"reason": body.reason, "policy": body.policy, "tenant": body.tenant,
               "key_from": body.key_from, "key_to": body.key_to}  # fmt: skip
    output = commands.run(policy_cli.hold_place, options)
    hold = LegalHold.objects.get(pk=options["hold_id"])
    return {"output": output, "id": hold.pk, "etag": etag_of(hold)}


@router.get("/holds/{hold_id}", response={200: schemas.HoldOut, **ERRORS}, auth=Token())
def show(request, response: HttpResponse, hold_id: int):
    hold = hold_or_404(hold_id)
    tag(response, etag_of(hold))
    return hold_out(hold)


def _release_step(name: str, handler, text: str, *, sudo: bool = False):
    """One step of the two-person release; ``sudo``: the approver's password with the request,
    as for a version's approval (a token alone cannot release what a hold protects)."""

    def decide(request, hold_id: int, reason: str):
        hold_or_404(hold_id)
        output = commands.run(handler, hold_id=hold_id, reason=reason, expected=if_match(request))
        return {"output": output, "etag": etag_of(hold_or_404(hold_id))}

    route = dict(response={200: schemas.Done, **ERRORS}, auth=Token(COMPLIANCE),
                 operation_id=f"hold_{name.replace('-', '_')}", summary=text)  # fmt: skip
    if sudo:

        @router.post(f"/holds/{{hold_id}}/{name}", **route)
        def endpoint(request, hold_id: int, body: schemas.Approval):
            hold_or_404(hold_id)
            password_again(request, body.password, f"the release of hold #{hold_id}")
            return decide(request, hold_id, body.reason)

    else:

        @router.post(f"/holds/{{hold_id}}/{name}", **route)
        def endpoint(request, hold_id: int, body: schemas.Reason):
            return decide(request, hold_id, body.reason)

    endpoint.__doc__ = (
        f"{text} (``retention hold {name}``). ``If-Match``: the hold's ETag the decision was "
        "made on; 412 ``stale_state`` when it moved on."
        + (" With the approver's password (sudo)." if sudo else "")
    )


_release_step("release", policy_cli.hold_release, "Request a hold's release")
_release_step("approve-release", policy_cli.hold_approve_release,
              "Approve a release another member of compliance requested", sudo=True)  # fmt: skip
_release_step("withdraw-release", policy_cli.hold_withdraw_release,
              "Withdraw your own release request")  # fmt: skip
_release_step("refuse-release", policy_cli.hold_refuse_release,
              "Refuse another member's release request")  # fmt: skip
