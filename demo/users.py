"""Demo accounts: one user per role of the design, plus a superuser.

Created only by ``manage.py demo`` (never by a migration), because their
passwords are public: password = username + "-demo".
"""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.db import transaction

from core.roles import ALL_ROLES, AUDITOR, COMPLIANCE, ONCALL, VIEWER

DEMO_USERS: dict[str, tuple[str, ...]] = {
    "alice": (COMPLIANCE,),
    "carol": (COMPLIANCE,),
    "oscar": (ONCALL,),
    "audrey": (AUDITOR,),
    "victor": (VIEWER,),
}
SUPERUSER = "admin"


def demo_password(username: str) -> str:
    return f"{username}-demo"


@transaction.atomic
def ensure_demo_users() -> list[str]:
    """Make the role groups, the demo users and their memberships exist; return the
    usernames created now. An existing user keeps its password; its demo role groups
    are added if missing."""
    groups = {name: Group.objects.get_or_create(name=name)[0] for name in ALL_ROLES}
    created: list[str] = []
    for username, roles in DEMO_USERS.items():
        user, new = User.objects.get_or_create(username=username)
        if new:
            user.set_password(demo_password(username))
            user.save(update_fields=["password"])
            created.append(username)
        user.groups.add(*(groups[role] for role in roles))
    admin, new = User.objects.get_or_create(
        username=SUPERUSER, defaults={"is_superuser": True, "is_staff": True}
    )
    if new:
        admin.set_password(demo_password(SUPERUSER))
        admin.save(update_fields=["password"])
        created.append(SUPERUSER)
    elif not (admin.is_superuser and admin.is_staff):
        admin.is_superuser = admin.is_staff = True
        admin.save(update_fields=["is_superuser", "is_staff"])
    return created
