"""Typed readers for configuration from the environment.

Each reader fails loudly: a bad value stops start-up with one line naming the
variable (``ConfigError`` is turned into that line by ``manage.py``), never a
silent default.
"""

from __future__ import annotations

import os


class ConfigError(Exception):
    """A configuration value is missing or malformed."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of true/false/1/0/yes/no/on/off, got {raw!r}")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(name: str, url: str) -> dict:
    """Turn a ``postgresql://`` URL into Django's DATABASES entry.

    The URL is parsed by libpq (through psycopg), so every form libpq accepts
    works, including ``?host=/socket/dir``.
    """
    from psycopg.conninfo import conninfo_to_dict

    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name} must be a postgresql:// URL, got {url!r}")
    try:
        params = conninfo_to_dict(url)
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's words
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{name} is not a valid PostgreSQL URL ({reason})") from None
    port = params.get("port", "")
    if port and not all(part.isdigit() for part in str(port).split(",")):
        raise ConfigError(f"{name} has a non-numeric port {port!r}")
    dbname = params.pop("dbname", None)
    if not dbname:
        raise ConfigError(f"{name} must name a database, got {url!r}")
    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": params.pop("port", ""),
        "OPTIONS": params,
    }
    return entry
