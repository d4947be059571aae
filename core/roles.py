"""The four roles of the design and what each may do.

Roles are Django groups. A superuser holds every role. Views call
``require_role`` first; templates ask ``roles`` (see the context processor).
"""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import PermissionDenied

from core.seals import is_sealed

COMPLIANCE = "compliance"
ONCALL = "oncall"
AUDITOR = "auditor"
VIEWER = "viewer"
ALL_ROLES = (COMPLIANCE, ONCALL, AUDITOR, VIEWER)

# What each role does (the design's role table); every role reads dashboards.
ROLE_DESCRIPTIONS = {
    COMPLIANCE: "writes and approves policy versions (never their own), places legal holds and"
    " releases them with a second member (never their own request)",
    ONCALL: "pauses, resumes and cancels runs and policies, flips the kill switch, replays dead letters",
    AUDITOR: "reads everything, exports audit evidence",
    VIEWER: "reads dashboards",
}


def roles_of(user) -> frozenset[str]:
    """The roles ``user`` holds: none unless the account's seal holds (core.seals), every
    role for a superuser, else its role groups."""
    if not getattr(user, "is_authenticated", False):
        return frozenset()
    cached = getattr(user, "_retention_roles", None)
    if cached is None:
        groups = getattr(user, "_sealed_groups", None)  # read with its seal (core.seals)
        if groups is None:
            groups = sorted(user.groups.values_list("name", flat=True))
        if not is_sealed(user, groups):
            cached = frozenset()
        elif user.is_superuser:
            cached = frozenset(ALL_ROLES)
        else:
            cached = frozenset(g for g in groups if g in ALL_ROLES)
        user._retention_roles = cached
    return cached


def has_role(user, *roles: str) -> bool:
    return bool(roles_of(user) & set(roles))


def check_role(user, *roles: str) -> None:
    if not has_role(user, *roles):
        raise PermissionDenied(f"requires one of the roles: {', '.join(roles)}")


# The product's own processes, which act in their own name (a string, not a person): the
# schedule, the reconciler, the workers, the guard and the demo's start-up.
SYSTEM_ACTORS = frozenset({"scheduler", "startup", "reconciler", "worker", "guard"})


def check_role_or_system(actor, *roles: str) -> None:
    """A person needs one of ``roles``; a name passes only when it is one of the product's
    own processes (``SYSTEM_ACTORS``), so a username passed by mistake acts as nobody."""
    if isinstance(actor, str):
        if actor not in SYSTEM_ACTORS:
            raise PermissionDenied(
                f"{actor!r} is not a signed-in person nor one of the product's own processes"
            )
        return
    check_role(actor, *roles)


def require_role(*roles: str):
    """View decorator: 403 unless the user holds one of ``roles`` (any role if none given)."""
    needed = roles or ALL_ROLES

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            check_role(request.user, *needed)
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
