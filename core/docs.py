"""The docs folder's Markdown pages, served read-only to signed-in users (``/docs/<name>/``).

No Markdown library: headings become anchored ``<h1>``–``<h6>`` (the anchor is the heading's
words before any ``—``: ``## Audit — `/runs/audit/``` → ``#audit``), so pages can link the
section that explains them, and everything between headings is shown as written, escaped,
in ``<pre>`` blocks. Only the ``*.md`` files directly in ``docs/`` are served, looked up by
name in the folder's listing, never by a path taken from the request.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def docs_dir() -> Path:
    return Path(settings.BASE_DIR) / "docs"


def available() -> dict[str, Path]:
    """``{name: path}`` of the Markdown files in the docs folder."""
    return {p.stem: p for p in sorted(docs_dir().glob("*.md")) if p.is_file()}


def anchor(heading: str) -> str:
    words = heading.split(" — ", 1)[0].replace("`", "")
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-") or "section"


def _inline_code(text: str) -> str:
    parts = escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render(text: str) -> tuple[str, SafeString]:
    """The page's title (its first heading) and its body as HTML."""
    out: list[str] = []
    block: list[str] = []
    seen: dict[str, int] = {}
    title = ""
    in_fence = False

    def flush() -> None:
        body = "\n".join(block).strip("\n")
        if body:
            out.append(f'<pre class="doc">{escape(body)}</pre>')
        block.clear()

    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        found = None if in_fence else HEADING.match(line)
        if not found:
            block.append(line)
            continue
        flush()
        level, words = len(found.group(1)), found.group(2)
        slug = anchor(words)
        seen[slug] = seen.get(slug, 0) + 1
        if seen[slug] > 1:
            slug = f"{slug}-{seen[slug]}"
        title = title or words.replace("`", "")
        out.append(f'<h{level} id="{slug}">{_inline_code(words)}</h{level}>')
    flush()
    return title, mark_safe("\n".join(out))  # noqa: S308 — every text above is escaped
