"""``retention trigger|status|drain|pause|resume|cancel|replay|kill-switch ...`` sub-commands."""

from __future__ import annotations


def register(areas) -> None:
    """Add this app's sub-commands to the ``retention`` command's sub-parsers."""
