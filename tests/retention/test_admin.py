"""The Django admin is a read-only window: every change goes through the actions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import NoReverseMatch, reverse

from core.models import OperatorAction
from retention import actions
from retention.models import LegalHold, Policy, PolicyVersion
from retention.spec import load_toml

from .conftest import policy_toml


@pytest.fixture
def draft(events_table, alice) -> PolicyVersion:
    return actions.apply_spec(load_toml(policy_toml()), author=alice)


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def test_a_staff_user_without_permissions_can_neither_list_nor_delete_a_draft(draft, client):
    client.force_login(staff("stan"))
    delete = reverse("admin:retention_policyversion_delete", args=[draft.pk])

    assert client.get(reverse("admin:retention_policyversion_changelist")).status_code == 403
    assert (
        client.get(reverse("admin:retention_policyversion_change", args=[draft.pk])).status_code
        == 403
    )
    assert client.post(delete, {"post": "yes"}).status_code == 403
    bulk = client.post(
        reverse("admin:retention_policyversion_changelist"),
        {"action": "delete_selected", "_selected_action": [draft.pk], "post": "yes"},
    )
    assert bulk.status_code == 403
    assert PolicyVersion.objects.filter(pk=draft.pk).exists()


@pytest.mark.parametrize("who", ["staff-with-every-permission", "superuser"])
def test_no_one_changes_product_rows_through_the_admin(draft, client, who):
    if who == "superuser":
        user = User.objects.create_superuser("root", password="pw")
    else:
        user = staff("stan")
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="retention"))
    client.force_login(user)
    actions_before = OperatorAction.objects.count()

    page = client.get(reverse("admin:retention_policyversion_change", args=[draft.pk]))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    delete = reverse("admin:retention_policyversion_delete", args=[draft.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    change = reverse("admin:retention_policy_change", args=[draft.policy_id])
    client.post(change, {"slug": "renamed", "name": "x", "schedule": "* * * * *"})
    for model in ("policy", "policyversion", "legalhold", "operatoraction", "killswitch"):
        try:
            add = reverse(f"admin:retention_{model}_add")
        except Exception:
            continue
        assert client.get(add).status_code == 403, model

    assert PolicyVersion.objects.filter(pk=draft.pk).exists()
    assert Policy.objects.get().slug == "events"
    assert not LegalHold.objects.exists()
    assert OperatorAction.objects.count() == actions_before


def test_django_q_schedules_and_failed_tasks_cannot_be_added_or_resubmitted_in_the_admin(
    db, client
):
    from django_q.models import Schedule

    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.get(reverse("admin:django_q_schedule_changelist")).status_code == 200
    page = client.post(
        reverse("admin:django_q_schedule_add"),
        {"func": "os.system", "args": "'id'", "schedule_type": "O", "repeats": "-1"},
    )
    assert page.status_code == 403
    assert not Schedule.objects.filter(func="os.system").exists()
    # failed (and successful) tasks have no admin pages at all: their rows hold pickles
    # the workers wrote (tests/security/test_worker_role_reach.py), so nothing to resubmit
    with pytest.raises(NoReverseMatch):
        reverse("admin:django_q_failure_changelist")
    assert client.get("/admin/django_q/failure/").status_code == 404
