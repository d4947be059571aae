"""A command-line handler run for an API request: the same function ``manage.py retention``
calls, with the same options, its output captured. So the command line as an API client
prints exactly what it prints against the database (``retention_client``), and the typed
endpoints that back a command carry that text as ``output``."""

from __future__ import annotations

import io
from types import SimpleNamespace

from django.core.management.base import CommandError, OutputWrapper
from ninja import Schema

from .errors import ApiError, classify


class Output(Schema):
    """What the command line prints for this operation: stdout, stderr, its exit status."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


def run(handler, options: dict | None = None, /, **more) -> Output:
    """``handler(command, options)`` with its output captured (``options``: a dict the caller
    keeps, for what the handler leaves in it). A refusal becomes the API's error
    (``api.errors``) and keeps what was written before it."""
    options = options if options is not None else {}
    options.setdefault("verbosity", 1)
    options.update(more)
    out, err = io.StringIO(), io.StringIO()
    command = SimpleNamespace(stdout=OutputWrapper(out), stderr=OutputWrapper(err))
    try:
        # past ``one_line``, which turns a refusal into the command line's one error line:
        # here each kind of refusal keeps its own status and code
        code = getattr(handler, "__wrapped__", handler)(command, options)
    except Exception as exc:
        error = classify(exc)
        if error is None:
            raise
        if isinstance(exc, CommandError) and (out.getvalue() or err.getvalue()):
            error = ApiError(400, "command_failed", error.message)
        error.extra.update(stdout=out.getvalue(), stderr=err.getvalue())
        raise error from None
    return Output(stdout=out.getvalue(), stderr=err.getvalue(), exit_code=code or 0)
