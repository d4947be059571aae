"""What every request's input must be before any endpoint reads it: no NUL character in the
path, a query parameter, a header the API reads or a string of the JSON body (PostgreSQL's
text holds none: psycopg refuses it, which would be a 500), and no integer of the JSON body
beyond PostgreSQL's ``bigint``. One check for every endpoint, so a new one is covered too;
the answer is the API's one error shape, 422 ``invalid_request`` naming where."""

from __future__ import annotations

import json

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
HEADERS = ("If-Match",)


def problem(request) -> str | None:
    """One sentence on the first malformed input of ``request``, or None."""
    if "\x00" in request.path:
        return "the path contains a NUL character"
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in v for v in values):
            return f"query parameter {name.replace(chr(0), '')!r} contains a NUL character"
    for header in HEADERS:
        if "\x00" in request.headers.get(header, ""):
            return f"header {header} contains a NUL character"
    if request.content_type != "application/json" or not request.body:
        return None
    try:
        body = json.loads(request.body)
    except ValueError:
        return None  # the schema's own check answers it
    return _walk(body)


def _walk(value, where: str = "") -> str | None:
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        at = at or "the body"
        if isinstance(item, str):
            if "\x00" in item:
                return f"{at} contains a NUL character"
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not BIGINT_MIN <= item <= BIGINT_MAX:
                return f"{at} is out of range (a 64-bit integer: {BIGINT_MIN} to {BIGINT_MAX})"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if "\x00" in key:
                    return f"{at} has a key with a NUL character"
                stack.append((inner, key if at == "the body" else f"{at}.{key}"))
        elif isinstance(item, list):
            stack.extend((inner, f"{at}[{i}]") for i, inner in enumerate(item))
    return None
