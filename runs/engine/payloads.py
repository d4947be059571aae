"""What a cluster runs: the product's own entry points, nothing else.

django-q2 signs a queued task with ``SECRET_KEY`` and unpickles it once the signature checks.
The web host and every worker host hold that key, and the worker login may insert into the
queue (a lease re-enqueues its next generation), so a valid signature proves only that the
key was used — not that the product made the task. Where the cluster's pusher turns a queued
message into a task, this module's package replaces django-q2's: the pickle may name no
callable or class beyond plain data (``SAFE_GLOBALS``: a ``__reduce__`` gadget fails before
anything runs), the task's function must be one of ``PRODUCT_TASKS`` by name, and it carries
no hook. Anything else is refused as a bad signature: django-q2 logs it and fails the
message; nothing runs (``tests/security/test_decisions.py``)."""

from __future__ import annotations

import io
import pickle

from django_q import pusher
from django_q import signing as q_signing
from django_q.core_signing import BadSignature

from runs.engine import dispatch, maintenance, schedules

PRODUCT_TASKS = frozenset(
    {dispatch.DRAIN_TASK, maintenance.VACUUM_TASK, *schedules.SCHEDULED_TASKS}
)
SAFE_GLOBALS = frozenset(
    {
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("uuid", "UUID"),
    }
)


class RefusedTask(BadSignature):
    """A queued message the product did not make; the cluster fails it unrun."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in SAFE_GLOBALS:
            raise RefusedTask(f"a queued task names {module}.{name}, which is not plain data")
        return super().find_class(module, name)


def check_task(task) -> dict:
    """``task`` if it is one of the product's own, else ``RefusedTask``."""
    if not isinstance(task, dict):
        raise RefusedTask("a queued message that is not a task")
    func = task.get("func")
    if not isinstance(func, str) or func not in PRODUCT_TASKS:
        raise RefusedTask(f"a queued task runs {func!r}, not one of the product's entry points")
    if task.get("hook"):
        raise RefusedTask(f"a queued task carries a hook ({task['hook']!r})")
    return task


class _DataSerializer:
    @staticmethod
    def loads(data: bytes):
        return _DataOnly(io.BytesIO(data)).load()


class ProductTaskPackage(q_signing.SignedPackage):
    """django-q2's signed package, loaded as plain data and accepted only as a product task."""

    @staticmethod
    def loads(obj):
        task = q_signing.signing.loads(
            obj,
            key=q_signing.Conf.SECRET_KEY,
            salt=q_signing.Conf.PREFIX,
            serializer=_DataSerializer,
        )
        return check_task(task)


def install() -> None:
    """Make the cluster's pusher (the one place a queued message becomes a task) load messages
    with ``ProductTaskPackage``."""
    pusher.SignedPackage = ProductTaskPackage
