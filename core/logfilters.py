"""Logging filters."""

from __future__ import annotations

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """A 4xx answer (a 403 for a missing role, a 404) is the client's mistake, not a fault:
    keep its one-line record (``Forbidden (Permission denied): /path``) without the
    traceback Django attaches. 5xx records keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if 400 <= getattr(record, "status_code", 0) < 500:
            record.exc_info, record.exc_text = None, None
        return True
