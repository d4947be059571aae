"""An external admission signal: one PromQL query against a Prometheus server's HTTP API.

The guard's sampler asks it once per sample (runs.engine.guard); what is pressure and when
no answer counts as pressure is the guard's to judge. The standard library's HTTP client is
enough for one GET with a timeout.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class Source:
    """Where the signal comes from and how it is judged (a policy's ``guard.prometheus_*``
    keys, each falling back to the instance's ``RETENTION_GUARD_PROMETHEUS_*``)."""

    url: str
    query: str
    threshold: float
    timeout_ms: int
    grace_s: int

    @property
    def key(self) -> str:
        """The name a sample keeps this source's reading under."""
        return hashlib.sha256(f"{self.url}\n{self.query}".encode()).hexdigest()[:16]


def source_of(spec) -> Source | None:
    """The Prometheus signal that applies to ``spec``'s chunks, or None when none is set up
    (no URL, query or threshold from the policy or the instance)."""
    cfg = settings.RETENTION

    def pick(own, instance):
        return own if own is not None else instance

    url = pick(spec.prometheus_url, cfg["GUARD_PROMETHEUS_URL"] or None)
    query = pick(spec.prometheus_query, cfg["GUARD_PROMETHEUS_QUERY"] or None)
    threshold = pick(spec.prometheus_threshold, cfg["GUARD_PROMETHEUS_THRESHOLD"])
    if not url or not query or threshold is None:
        return None
    return Source(
        url=url.rstrip("/"),
        query=query,
        threshold=float(threshold),
        timeout_ms=int(pick(spec.prometheus_timeout_ms, cfg["GUARD_PROMETHEUS_TIMEOUT_MS"])),
        grace_s=int(pick(spec.prometheus_grace_s, cfg["GUARD_PROMETHEUS_GRACE_S"])),
    )


class NoAnswer(Exception):
    """Prometheus gave no usable answer (unreachable, timed out, an error, not a number)."""


def query(source: Source) -> float | None:
    """The query's value now: the highest value of an instant vector (or the scalar); None
    for an empty result, which is an answer (nothing over the threshold). Raises ``NoAnswer``."""
    url = f"{source.url}/api/v1/query?" + urllib.parse.urlencode({"query": source.query})
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=source.timeout_ms / 1000) as response:
            body = json.loads(response.read(1_000_000))
    except urllib.error.HTTPError as exc:
        detail = ""
        try:
            detail = json.loads(exc.read(10_000)).get("error", "")
        except (ValueError, AttributeError):
            pass
        raise NoAnswer(f"HTTP {exc.code}{': ' + detail if detail else ''}") from None
    except (OSError, ValueError) as exc:  # refused, timed out, reset, not JSON
        reason = getattr(exc, "reason", exc)
        raise NoAnswer(str(reason) or type(exc).__name__) from None
    if body.get("status") != "success":
        raise NoAnswer(body.get("error") or "the query failed")
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "scalar":
            values = [float(result[1])]
        elif kind == "vector":
            values = [float(item["value"][1]) for item in result]
        else:
            raise NoAnswer(f"a {kind} result, not an instant vector or scalar")
    except (TypeError, KeyError, IndexError, ValueError):
        raise NoAnswer("an answer that is not a number") from None
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else None
