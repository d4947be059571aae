"""The four roles of the design and what each may do.

Roles are Django groups. A superuser holds every role. Views call
``require_role`` first; templates ask ``roles`` (see the context processor).
"""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import PermissionDenied

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
    if not getattr(user, "is_authenticated", False):
        return frozenset()
    if user.is_superuser:
        return frozenset(ALL_ROLES)
    cached = getattr(user, "_retention_roles", None)
    if cached is None:
        names = set(user.groups.filter(name__in=ALL_ROLES).values_list("name", flat=True))
        cached = frozenset(names)
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
