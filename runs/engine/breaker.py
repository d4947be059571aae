"""The run's circuit breaker: one cause is one problem.

A permanent error whose cause is the run's, not a row's — a column renamed or a table gone
under a live run, a privilege revoked — fails every chunk of the run alike. The first
chunks it fails are dead-lettered as usual (a single chunk's failure may be its own); when
``RETENTION_BREAKER_CHUNKS`` chunks in a row (no chunk of the run done since) fail with the
same cause — SQLSTATE and the object it names — the breaker opens: the run needs attention,
its state reason names the cause, and the failing chunk stays pending instead of becoming
one more dead letter. No further chunk of the run is admitted. When the cause is fixed one
decision, ``runs.actions.retry_run``, replays the run's open dead letters of run-level
causes and resumes it; its chunks are admissible at once.

Row-level causes (class 23: a restricting foreign key, a constraint) never open it: their
chunks are bisected down to the offending rows, whose dead letters stay for a person."""

from __future__ import annotations

import re

from django.conf import settings
from django.db.models import Max

from runs.engine.errors import PERMANENT, Classified
from runs.models import Chunk, DeadLetter, Run

BREAKER_PREFIX = "circuit breaker open"
_QUOTED = re.compile(r'"([^"]+)"')


def run_level(cls: Classified) -> bool:
    """Whether a failure of this class is the run's (the same for every chunk of it)."""
    return cls.kind == PERMANENT and bool(cls.sqlstate) and not cls.sqlstate.startswith("23")


_NAMED = re.compile(
    r'\b(column|relation|table|function|schema|constraint|role|type)\s+"?([\w.$]+)"?'
)


def cause_of(exc: BaseException, cls: Classified) -> str:
    """The failure's cause as SQLSTATE and object: ``42703 column status``. The object is
    what the server's diagnostics name (schema, table, column, constraint), else what its
    message names (a column's table alias left out)."""
    diag = None
    for candidate in (exc, getattr(exc, "__cause__", None)):
        diag = getattr(candidate, "diag", None) or diag
    names: list[str] = []
    if diag is not None:
        for field in ("schema_name", "table_name", "column_name", "constraint_name"):
            value = getattr(diag, field, None)
            if value:
                names.append(str(value))
    if names:
        return f"{cls.sqlstate} {'.'.join(names)}"
    text = getattr(diag, "message_primary", None) or (str(exc).strip().splitlines() or [""])[0]
    found = _NAMED.search(text)
    if found:
        kind, name = found.groups()
        return f"{cls.sqlstate} {kind} {name.rsplit('.', 1)[-1] if kind == 'column' else name}"
    quoted = _QUOTED.findall(text)
    return f"{cls.sqlstate} {'.'.join(quoted)}".strip()


def trips(run: Run, cls: Classified, cause: str) -> int:
    """How many chunks in a row have failed with ``cause`` (this one included) when that
    reaches the breaker's count, else 0: the run's open dead letters of chunks with the same
    cause since the run last completed a chunk."""
    if not run_level(cls):
        return 0
    need = settings.RETENTION.get("BREAKER_CHUNKS", 3)
    last_done = Chunk.objects.filter(run=run, state=Chunk.State.DONE).aggregate(at=Max("done_at"))[
        "at"
    ]
    letters = DeadLetter.objects.filter(
        run=run, resolution=DeadLetter.Resolution.OPEN, chunk__isnull=False, context__cause=cause
    )
    if last_done is not None:
        letters = letters.filter(created_at__gt=last_done)
    earlier = letters.count()
    return earlier + 1 if earlier + 1 >= need else 0


def reason(cause: str, label: str, message: str, chunks: int) -> str:
    """The attention item's sentence: the cause, how many chunks it failed, the way out."""
    return (
        f"{BREAKER_PREFIX}: {chunks} chunks in a row failed with {label} ({cause}): {message} — "
        "no chunk of the run is admitted; its chunks are kept pending. Fix the cause, then "
        "retry the run"
    )


def is_open(run: Run) -> bool:
    return run.state == Run.State.ATTENTION and run.state_reason.startswith(BREAKER_PREFIX)
