"""Reading a page's filters from its query string: one clear error per bad value, never a 500.

``QueryFilters(request.GET)`` reads each filter with ``text``, ``choice``, ``day``; a bad
value is recorded in ``errors`` (naming the filter) and read as empty. A page with errors
answers 400 with the errors and no results, rather than silently dropping a filter.
"""

from __future__ import annotations

import unicodedata
from datetime import date, timedelta

MAX_TEXT = 200
BIGINT_MAX = 2**63 - 1
# A day filter covers [day, day + 1): both ends must be representable.
FIRST_DAY, LAST_DAY = date.min + timedelta(days=1), date.max - timedelta(days=1)


def as_id(text: str) -> int | None:
    """``text`` as a row id (ASCII digits, within bigint), else None. ``str.isdigit`` alone
    accepts '²' and other digits ``int()`` refuses."""
    if text.isascii() and text.isdigit() and int(text) <= BIGINT_MAX:
        return int(text)
    return None


class QueryFilters:
    def __init__(self, query) -> None:
        self.query = query
        self.errors: list[str] = []

    def _raw(self, name: str) -> str:
        return (self.query.get(name) or "").strip()

    def text(self, name: str, *, max_length: int = MAX_TEXT) -> str:
        raw = self._raw(name)
        if any(unicodedata.category(c) == "Cc" for c in raw):
            self.errors.append(f"{name}: must not contain control characters")
            return ""
        if len(raw) > max_length:
            self.errors.append(f"{name}: must be at most {max_length} characters")
            return ""
        return raw

    def choice(self, name: str, choices, *, default: str = "") -> str:
        raw = self._raw(name)
        if not raw:
            return default
        if raw not in choices:
            self.errors.append(f"{name}: must be one of {', '.join(choices)}")
            return default
        return raw

    def day(self, name: str) -> date | None:
        raw = self._raw(name)
        if not raw:
            return None
        try:
            value = date.fromisoformat(raw)
        except ValueError:
            self.errors.append(f"{name}: must be a date (YYYY-MM-DD), got {raw[:40]!r}")
            return None
        if not FIRST_DAY <= value <= LAST_DAY:
            self.errors.append(f"{name}: must be between {FIRST_DAY} and {LAST_DAY}")
            return None
        return value
