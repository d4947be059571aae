"""The live server's requests end with the test that made them.

pytest-django's ``live_server`` lives for the whole session, and a test's database is emptied
after it (one ``TRUNCATE`` of every table). A page still open when the test ends keeps asking
(the overview and the run page poll every few seconds), and a request it made may still be in
flight on the server's thread: a progress read is one snapshot transaction over runs, chunks,
audit records and the broker's queue, holding each table's lock once it has read it. With the
``TRUNCATE`` holding some tables and waiting for one such read has, and the read waiting for
one the ``TRUNCATE`` holds, PostgreSQL ends one of them as a deadlock — and when that is the
flush, the next test starts on the last one's rows.

``LiveServerGate`` sits in front of the server's application: while a test runs every request
passes; when the test ends the gate closes (a request that arrives then is answered 503 without
touching the database) and waits until the requests in flight have sent their last byte. Only
then is the database emptied.
"""

from __future__ import annotations

import threading

WAIT_S = 120.0  # the longest a request in flight may take to finish, on a very busy machine


class LiveServerGate:
    """The WSGI application of the live server, behind a gate (``open``, ``close_and_wait``)."""

    def __init__(self, app) -> None:
        self.app = app
        self._changed = threading.Condition()
        self._open = True
        self._in_flight = 0

    @classmethod
    def around(cls, live_server) -> LiveServerGate:
        """The gate of ``live_server``'s application, put in front of it the first time."""
        httpd = live_server.thread.httpd
        app = httpd.get_app()
        if not isinstance(app, cls):
            app = cls(app)
            httpd.set_app(app)
        return app

    def open(self) -> None:
        with self._changed:
            self._open = True

    def close_and_wait(self, timeout_s: float = WAIT_S) -> None:
        """Refuse new requests and wait for those in flight (AssertionError after
        ``timeout_s``: the database is not emptied under a request still running)."""
        with self._changed:
            self._open = False
            if not self._changed.wait_for(lambda: self._in_flight == 0, timeout_s):
                raise AssertionError(
                    f"{self._in_flight} live server request(s) still running after {timeout_s} s"
                )

    def _finished(self) -> None:
        with self._changed:
            self._in_flight -= 1
            self._changed.notify_all()

    def __call__(self, environ, start_response):
        with self._changed:
            if not self._open:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"the test has ended\n"]
            self._in_flight += 1
        try:
            response = self.app(environ, start_response)
        except BaseException:
            self._finished()
            raise
        return _UntilClosed(response, self._finished)


class _UntilClosed:
    """A response whose end (the server closes it once it has sent it, or failed to) tells the
    gate: a streamed body (an audit export) still reads the database while it is sent."""

    def __init__(self, response, finished) -> None:
        self.response = response
        self.finished = finished

    def __iter__(self):
        return iter(self.response)

    def close(self) -> None:
        try:
            close = getattr(self.response, "close", None)
            if close is not None:
                close()
        finally:
            finished, self.finished = self.finished, None
            if finished is not None:
                finished()
