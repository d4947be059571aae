"""System checks for settings that weaken security; shown by ``check``, ``runserver`` and
``qcluster`` at start-up."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register


def demo_weakenings() -> list[str]:
    """What ``RETENTION_DEMO=1`` turned off in this process, in words."""
    if not settings.DEMO:
        return []
    weak = []
    if settings.SECRET_KEY == settings.DEMO_SECRET_KEY:
        weak.append("the public demo SECRET_KEY (anyone can forge sessions)")
    if not settings.SESSION_COOKIE_SECURE:
        weak.append("cookies without Secure")
    if not settings.SECURE_SSL_REDIRECT:
        weak.append("no HTTPS redirect")
    if not settings.SECURE_HSTS_SECONDS:
        weak.append("no HSTS")
    return weak


@register()
def demo_mode(app_configs, **kwargs) -> list[Warning]:
    weak = demo_weakenings()
    if not weak:
        return []
    return [
        Warning(
            "RETENTION_DEMO=1 runs with " + ", ".join(weak) + ".",
            hint="For anything but a demo on this machine, unset RETENTION_DEMO and set "
            "SECRET_KEY (docs/security.md).",
            id="core.W001",
        )
    ]


@register()
def md5_passwords(app_configs, **kwargs) -> list[Warning]:
    if not settings.TEST_MD5_PASSWORDS:
        return []
    return [
        Warning(
            "RETENTION_TEST_MD5_PASSWORDS=1 hashes new passwords with MD5, which anyone holding "
            "the database can reverse.",
            hint="It is for the test suite only: unset it, and have users whose password was "
            "set meanwhile choose a new one.",
            id="core.W002",
        )
    ]
