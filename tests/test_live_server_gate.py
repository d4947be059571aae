"""A live server test's requests end before its database is emptied (tests/live_server_gate.py):
the gate in front of a WSGI application that answers when the test says so, and a real request
to the live server after the gate closed."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from tests.live_server_gate import LiveServerGate


class SlowApp:
    """A WSGI application whose body's last part is sent when ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.closed = threading.Event()

    def __call__(self, environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        self.started.set()
        return self.body()

    def body(self):
        try:
            yield b"first part\n"
            self.release.wait(30)
            yield b"last part\n"
        finally:
            self.closed.set()


def serve(app, gate):
    """What a WSGI server does with one request: call, send every part, close."""
    sent = []
    result = gate({}, lambda status, headers: sent.append(status))
    try:
        sent.extend(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    return sent


def test_the_gate_waits_for_a_request_in_flight_until_its_body_is_sent_and_then_refuses_new_ones():
    app = SlowApp()
    gate = LiveServerGate(app)
    answers = []
    request = threading.Thread(target=lambda: answers.append(serve(app, gate)))
    request.start()
    assert app.started.wait(30)

    closed = threading.Event()
    closing = threading.Thread(target=lambda: (gate.close_and_wait(), closed.set()))
    closing.start()
    assert not closed.wait(0.5)  # still sending its body: the database is not emptied yet
    assert serve(app, gate)[0].startswith("503")  # a request that arrives now is refused

    app.release.set()
    assert closed.wait(30)
    closing.join(30)
    request.join(30)
    assert app.closed.is_set()
    assert answers == [["200 OK", b"first part\n", b"last part\n"]]

    gate.open()  # the next test's requests pass again
    app.release.set()
    assert serve(app, gate)[0] == "200 OK"


def test_a_request_in_flight_past_the_wait_fails_the_teardown_rather_than_the_flush():
    app = SlowApp()
    gate = LiveServerGate(app)
    request = threading.Thread(target=lambda: serve(app, gate))
    request.start()
    assert app.started.wait(30)
    with pytest.raises(AssertionError, match="1 live server request"):
        gate.close_and_wait(timeout_s=0.2)
    app.release.set()
    request.join(30)
    gate.close_and_wait(timeout_s=30)  # finished now


@pytest.mark.django_db(transaction=True)
def test_the_live_server_refuses_requests_once_its_test_has_ended(live_server, make_user):
    gate = LiveServerGate.around(live_server)
    with urllib.request.urlopen(f"{live_server.url}/login/") as response:
        assert response.status == 200  # the test runs: the gate is open
    gate.close_and_wait()
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{live_server.url}/login/")
        assert refused.value.code == 503
    finally:
        gate.open()
