"""Demo accounts (demo/users.py): one per role, plus a superuser."""

from __future__ import annotations

from django.contrib.auth.models import Group, User

from core.roles import ALL_ROLES, roles_of
from demo.users import ensure_demo_users

EXPECTED = {
    "alice": {"compliance"},
    "carol": {"compliance"},
    "oscar": {"oncall"},
    "audrey": {"auditor"},
    "victor": {"viewer"},
}


def test_it_creates_the_role_groups_and_a_user_in_each(db):
    created = ensure_demo_users()
    assert set(created) == {*EXPECTED, "admin"}
    assert set(Group.objects.values_list("name", flat=True)) >= set(ALL_ROLES)
    for username, groups in EXPECTED.items():
        user = User.objects.get(username=username)
        assert set(user.groups.values_list("name", flat=True)) == groups
        assert roles_of(user) == frozenset(groups)
        assert user.check_password(f"{username}-demo")
        assert not user.is_superuser and not user.is_staff


def test_admin_is_a_superuser_with_the_demo_password(db):
    ensure_demo_users()
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password("admin-demo")
    assert roles_of(admin) == frozenset(ALL_ROLES)


def test_a_second_call_creates_nobody_and_restores_memberships(db):
    ensure_demo_users()
    oscar = User.objects.get(username="oscar")
    oscar.groups.clear()
    oscar.set_password("changed-by-oscar")
    oscar.save()
    users, groups = User.objects.count(), Group.objects.count()

    assert ensure_demo_users() == []
    assert (User.objects.count(), Group.objects.count()) == (users, groups)
    oscar.refresh_from_db()
    assert set(oscar.groups.values_list("name", flat=True)) == {"oncall"}
    assert oscar.check_password("changed-by-oscar")  # a password of one's own is kept
