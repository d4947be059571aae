"""Decision fences over HTTP: a GET answers with the target's ``ETag`` (its decision token,
``core.oplog.decision_token``); a state change that sends it back as ``If-Match`` is refused
with 412 ``stale_state`` when the target moved on meanwhile — the pages' ``expected`` field."""

from __future__ import annotations

from core.oplog import decision_token


def etag_of(target) -> str:
    return decision_token(target)


def if_match(request) -> str | None:
    """The ETag the caller acted on (quotes and a weak prefix ignored), or None."""
    value = request.headers.get("If-Match", "").strip()
    if not value or value == "*":
        return None
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def tag(response, etag: str | None) -> None:
    if etag is not None:
        response["ETag"] = f'"{etag}"'
