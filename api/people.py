"""People: who is calling, roles (list, grant, revoke), adding a person, and one's own API
tokens (list, revoke). A token never creates a token: a new one comes from the dashboard's
API tokens page, after the password (docs/api.md, "Sudo")."""

from __future__ import annotations

from ninja import Router

from core import accounts, tokens
from core import cli as people_cli
from core.models import ApiToken
from core.roles import COMPLIANCE, roles_of

from . import commands, schemas
from .auth import Token, caller, password_again
from .errors import not_found
from .schemas import ERRORS

router = Router(tags=["people"])


@router.get("/me", response={200: schemas.Me, **ERRORS}, auth=Token())
def me(request):
    """The token's owner, their roles now, and the token's prefix."""
    who = caller(request)
    return {"username": who.user.username, "roles": sorted(roles_of(who.user)),
            "token": who.token.prefix}  # fmt: skip


@router.get("/roles", response={200: schemas.RolesOut, **ERRORS}, auth=Token())
def roles(request):
    """Who holds which role (``retention role list``)."""
    return {"roles": accounts.memberships(), "superusers": accounts.superusers(),
            "output": commands.run(people_cli.role_list)}  # fmt: skip


def _role_change(name: str, handler):
    @router.post(f"/roles/{name}", response={200: schemas.Done, **ERRORS},
                 auth=Token(COMPLIANCE), operation_id=f"role_{name}")  # fmt: skip
    def endpoint(request, body: schemas.RoleChange):
        password_again(request, body.password, f"the {name} of {body.role}")
        with accounts.password_confirmed(caller(request).user):
            return {"output": commands.run(handler, username=body.username, role=body.role,
                                           reason=body.reason)}  # fmt: skip

    endpoint.__doc__ = (
        f"{name.capitalize()} a role (``retention role {name}``): a superuser only, never on "
        "themself, with their password again. Compliance granted by one superuser makes an "
        "approver only once another superuser grants it too (the confirmation)."
    )


_role_change("grant", people_cli.role_grant)
_role_change("revoke", people_cli.role_revoke)


@router.post("/users", response={200: schemas.Done, **ERRORS}, auth=Token(COMPLIANCE))
def add_user(request, body: schemas.UserIn):
    """Add a person with no role yet (``retention user add``): a superuser only, with their
    password again (``actor_password``)."""

    def handler(command, options):
        user = accounts.add_user(body.username, body.password, actor=caller(request).user,
                                 email=body.email, via="api")  # fmt: skip
        command.stdout.write(f"user {user.username} added (no role yet)")

    password_again(request, body.actor_password, f"creating {body.username}")
    with accounts.password_confirmed(caller(request).user):
        return {"output": commands.run(handler)}


@router.get("/tokens", response={200: list[schemas.TokenOut], **ERRORS}, auth=Token())
def list_tokens(request):
    """The caller's own tokens, newest first."""
    return list(ApiToken.objects.filter(user=caller(request).user))


@router.post("/tokens/{token_id}/revoke", response={200: schemas.TokenOut, **ERRORS},
             auth=Token())  # fmt: skip
def revoke_token(request, token_id: int):
    """Revoke one of the caller's tokens (a superuser: anyone's); this one included."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise not_found(f"no token #{token_id}")
    return tokens.revoke_token(token, actor=caller(request).user)
