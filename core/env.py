"""Typed readers for configuration from the environment.

Each reader fails loudly: a bad value stops start-up with one line naming the
variable (``ConfigError`` is turned into that line by ``manage.py``), never a
silent default.
"""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import urlsplit

from psycopg import pq
from psycopg.conninfo import conninfo_to_dict


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


def env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def env_secret(name: str, *, minimum_length: int) -> bytes | None:
    """A secret from ``NAME`` or from the file named by ``NAME_FILE`` (trailing newline
    dropped); None when neither is set. Never echoed in an error."""
    value = os.environ.get(name)
    path = os.environ.get(f"{name}_FILE")
    if value and path:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if path:
        try:
            value = open(path, encoding="utf-8").read().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{name}_FILE cannot be read ({exc.strerror})") from None
    if not value:
        return None
    if len(value) < minimum_length:
        raise ConfigError(f"{name} must be at least {minimum_length} characters long")
    return value.encode()


def env_hex(name: str, *, length: int) -> bytes | None:
    """``length`` bytes written as hexadecimal digits (a public key); None when unset."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != length:
        raise ConfigError(f"{name} must be {length * 2} hexadecimal digits")
    return raw


_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def env_identifier(name: str, default: str) -> str:
    """A PostgreSQL identifier that needs no quoting (lower case letters, digits, ``_``)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip()
    if not _IDENTIFIER.fullmatch(value) or value.startswith("pg_"):
        raise ConfigError(
            f"{name} must be a lower-case PostgreSQL name (letters, digits, _; not pg_…), "
            f"got {raw!r}"
        )
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


_PASSWORD_PARAM = re.compile(r"(?i)(\bpassword=)([^&\s]*)")
MASK = "***"


def url_secrets(url: str) -> list[str]:
    """The passwords written in a connection URL (userinfo and ``password=`` parameters)."""
    found = [m.group(2) for m in _PASSWORD_PARAM.finditer(url) if m.group(2)]
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = url.partition("://")[2].partition("/")[0]
    userinfo = netloc.rpartition("@")[0]
    if ":" in userinfo and userinfo.partition(":")[2]:
        found.append(userinfo.partition(":")[2])
    return found


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password of ``url`` (or of ``text`` itself, when it is a URL)
    replaced by ``***``: messages and error reports never show credentials."""
    for secret in sorted(url_secrets(url if url is not None else text), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _PASSWORD_PARAM.sub(lambda m: m.group(1) + (MASK if m.group(2) else ""), text)


def _is_loopback(host: str) -> bool:
    if host == "" or host.startswith(("/", "@")) or host.lower() == "localhost":
        return True  # a Unix socket (libpq's default when no host is given) or this machine
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _libpq_defaults(service: str | None) -> dict[str, str]:
    """What libpq fills in for parameters a connection string leaves out: the service's
    (``service``, else ``PGSERVICE``, read from ``PGSERVICEFILE`` / ``~/.pg_service.conf`` /
    the system's service file), then the ``PG*`` environment variables — libpq's own
    resolution (``PQconndefaults``), so nothing of it is guessed here."""
    saved = os.environ.get("PGSERVICE")
    if service:
        os.environ["PGSERVICE"] = service
    try:
        options = pq.Conninfo.get_defaults()
    finally:
        if service:
            if saved is None:
                del os.environ["PGSERVICE"]
            else:
                os.environ["PGSERVICE"] = saved
    return {o.keyword.decode(): o.val.decode() for o in options if o.val is not None}


def connection_target(entry: dict) -> tuple[str, str]:
    """(host, hostaddr) a DATABASES entry connects to, as libpq resolves them: the entry's
    own, else its service's, else ``PGHOST`` / ``PGHOSTADDR`` ('' when none: a Unix socket)."""
    defaults = _libpq_defaults(entry["OPTIONS"].get("service"))
    host = str(entry.get("HOST") or defaults.get("host", ""))
    hostaddr = str(entry["OPTIONS"].get("hostaddr") or defaults.get("hostaddr", ""))
    return host, hostaddr


def is_local_database(entry: dict) -> bool:
    """True when every host and host address a DATABASES entry connects to is this machine
    (``connection_target``: a libpq service and the environment count, not only the URL)."""
    host, hostaddr = connection_target(entry)
    return all(_is_loopback(h.strip()) for h in host.split(",") + hostaddr.split(","))


def database_from_url(name: str, url: str) -> dict:
    """Turn a ``postgresql://`` URL into Django's DATABASES entry.

    The URL is parsed by libpq (through psycopg), so every form libpq accepts
    works, including ``?host=/socket/dir``.
    """
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name} must be a postgresql:// URL, got {redact(url)!r}")
    try:
        params = conninfo_to_dict(url)
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's words
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{name} is not a valid PostgreSQL URL ({redact(reason, url)})") from None
    port = params.get("port", "")
    if port and not all(part.isdigit() or not part for part in str(port).split(",")):
        raise ConfigError(f"{name} has a non-numeric port {redact(str(port), url)!r}")
    dbname = params.pop("dbname", None)
    if not dbname:
        raise ConfigError(f"{name} must name a database, got {redact(url)!r}")
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
