"""Account seals: a person's identity to the product (username, password hash, active and
superuser flags, role groups) carries a keyed digest (``core.models.AccountSeal``) that only
a process holding ``SECRET_KEY`` can write. The product's own changes — ``retention user
add``, ``role grant|revoke``, ``createsuperuser``, password changes, the admin — go through the
ORM and reseal (signals below). A user inserted, a password hash replaced, a role group joined
or a superuser flag set with the database login alone breaks the seal: that account then
signs in nowhere (pages, command line, tokens) and holds no role, and ``audit verify``
names it (docs/security.md)."""

from __future__ import annotations

import hmac
import json

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db.models.signals import m2m_changed, post_save

from core.models import AccountSeal, keyed_digest


def _group_names(user) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def read_once(user) -> list[str]:
    """``user``'s role groups, read for an instance loaded for one request or one command (its
    session's, its token's): the seal check and its roles (``core.roles.roles_of``) share this
    one reading instead of asking the database twice."""
    user._sealed_groups = _group_names(user)
    return user._sealed_groups


def mac_of(user, groups: list[str]) -> str:
    identity = [
        user.pk,
        user.get_username(),
        user.password,
        bool(user.is_active),
        bool(user.is_superuser),
        sorted(groups),
    ]
    return keyed_digest("account-seal", json.dumps(identity, separators=(",", ":")))


def reseal(user) -> None:
    AccountSeal.objects.update_or_create(
        user_id=user.pk, defaults={"mac": mac_of(user, _group_names(user))}
    )


def is_sealed(user, groups: list[str] | None = None) -> bool:
    """Whether ``user``'s identity is as the product last wrote it."""
    try:
        seal = user.seal
    except AccountSeal.DoesNotExist:
        return False
    groups = _group_names(user) if groups is None else groups
    return hmac.compare_digest(seal.mac, mac_of(user, groups))


def broken_seals() -> list[str]:
    """``username (id N)`` of every account whose seal is missing or does not match."""
    User = get_user_model()
    out = []
    for user in User.objects.select_related("seal").prefetch_related("groups").order_by("pk"):
        if not is_sealed(user, sorted(g.name for g in user.groups.all())):
            out.append(f"{user.get_username()} (id {user.pk})")
    return out


class SealedModelBackend(ModelBackend):
    """Django's ModelBackend that signs in (and keeps signed in) sealed accounts only."""

    def user_can_authenticate(self, user) -> bool:
        return super().user_can_authenticate(user) and is_sealed(user)

    def get_user(self, user_id):
        try:
            user = get_user_model()._default_manager.select_related("seal").get(pk=user_id)
        except get_user_model().DoesNotExist:
            return None
        groups = read_once(user)
        sealed = super().user_can_authenticate(user) and is_sealed(user, groups)
        return user if sealed else None


def _resealed_on_save(sender, instance, raw=False, **kwargs) -> None:
    if not raw:
        reseal(instance)


def _resealed_on_groups(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    User = get_user_model()
    if reverse and action == "pre_clear":  # group.user_set.clear(): note who leaves
        instance._leaving = list(instance.user_set.values_list("pk", flat=True))
    if action not in {"post_add", "post_remove", "post_clear"}:
        return
    if not reverse:
        reseal(instance)
        return
    # group.user_set.add/remove/clear(...): those users changed
    pks = pk_set if action != "post_clear" else getattr(instance, "_leaving", [])
    for user in User.objects.filter(pk__in=pks or []):
        reseal(user)


def connect() -> None:
    User = get_user_model()
    post_save.connect(_resealed_on_save, sender=User, dispatch_uid="core.seals.save")
    m2m_changed.connect(
        _resealed_on_groups, sender=User.groups.through, dispatch_uid="core.seals.groups"
    )
