"""The run engine's fixtures (an events table with a shadow copy, an approved policy)."""

from tests.runs.conftest import events, events_policy  # noqa: F401
