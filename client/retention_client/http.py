"""One JSON request to the API, with the personal token; plain HTTP only to loopback. A
redirect is followed only to the same scheme, host and port: the token is never sent
anywhere else (a redirect elsewhere is one clear error, and nothing is sent there)."""

from __future__ import annotations

import ipaddress
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

URL_ENV, TOKEN_ENV = "RETENTION_URL", "RETENTION_TOKEN"
PREFIX = "/api/v1"


class ClientError(Exception):
    """One line for the user (printed as the server's command line prints a refusal)."""


class ApiRefusal(ClientError):
    def __init__(self, status: int, body: dict):
        super().__init__(body.get("message") or f"HTTP {status}")
        self.status, self.body = status, body


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(url: str) -> str:
    """``RETENTION_URL`` checked: https anywhere, http only to a loopback address."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ClientError(f"{URL_ENV} must be an https:// URL, got {url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ClientError(
            f"{URL_ENV} {url!r} is plain HTTP to another machine: the token would cross the "
            "network readable; use https:// (plain http:// only to 127.0.0.1, ::1 or localhost)"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port spelled out when it is the scheme's own."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"https": 443, "http": 80}.get(parts.scheme)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the origin of ``RETENTION_URL``; anything else (another
    host, port or scheme — https to http included) is refused before a byte is sent there."""

    def __init__(self, base: str):
        super().__init__()
        self.base = base

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(target) != origin(self.base):
            raise ClientError(
                f"{self.base} answered with a redirect (HTTP {code}) to {_shown(target)}: not "
                f"followed, so the token is not sent there; set {URL_ENV} to the server's own "
                "address"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _shown(url: str) -> str:
    """A URL without its query (which could carry anything) for a message."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 600):
        self.base = base_url(url)
        if not token.strip():
            raise ClientError(
                f"set {TOKEN_ENV} to your personal API token (dashboard → API tokens)"
            )
        self.token = token.strip()
        self.timeout = timeout
        self.context = ssl.create_default_context()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.context), SameOriginRedirects(self.base)
        )

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None):
        """The decoded JSON answer; ``ApiRefusal`` for an error answer."""
        url = self.base + PREFIX + urllib.parse.quote(path, safe="/:")
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self.opener.open(request, timeout=self.timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = {"code": "http_error", "message": f"HTTP {exc.code} from {url}"}
            raise ApiRefusal(exc.code, answer) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"cannot reach {self.base}: {reason}") from None

    def raw(self, path: str, **query) -> bytes:
        """The answer's bytes (a CSV, a manifest); ``ApiRefusal`` for an error answer."""
        url = self.base + PREFIX + urllib.parse.quote(path, safe="/:")
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        request = urllib.request.Request(url, method="GET")
        request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as r:
                return r.read()
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read())
            except ValueError:
                answer = {"code": "http_error", "message": f"HTTP {exc.code} from {url}"}
            raise ApiRefusal(exc.code, answer) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ClientError(f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None

    def get(self, path: str, **query):
        return self.call("GET", path, query=query or None)

    def post(self, path: str, body: dict | None = None, **query):
        return self.call("POST", path, body or {}, query=query or None)
