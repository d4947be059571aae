"""The command-line client never forwards its token: a redirect to another host, another port
or another scheme (https to plain http, or anywhere plain http off this machine) is refused
with one clear error, and the place it points to receives nothing. A redirect within the
server's own origin is followed. Real HTTP servers on loopback; the client runs as its own
process, its package alone on the path (``tests.api.live.with_api``)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .live import with_api

TOKEN = "rrt_" + "s" * 43
SEEN: list[tuple[str, str, str | None]] = []  # (server, path, Authorization)


def handler_for(name: str, redirect_to):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's name
            SEEN.append((name, self.path, self.headers.get("Authorization")))
            target = redirect_to(self.path)
            if target:
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps(
                {"output": {"stdout": f"served by {name}\n", "stderr": "", "exit_code": 0}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@contextmanager
def server(name: str, host: str, redirect_to=lambda path: None):
    httpd = ThreadingHTTPServer((host, 0), handler_for(name, redirect_to))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def clean():
    SEEN.clear()
    yield
    SEEN.clear()


def status(url: str):
    return with_api(("status", "events/2026-12-01T03:00"), url=url, token=TOKEN)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"], ids=["other-port", "other-host"])
def test_a_redirect_to_another_port_or_host_is_refused_and_it_receives_nothing(host):
    with server("elsewhere", host) as elsewhere:
        with server("api", "127.0.0.1", lambda path: elsewhere + path) as url:
            result = status(url)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "answered with a redirect (HTTP 302) to " + elsewhere in result.stderr
    assert "not followed, so the token is not sent there" in result.stderr
    assert TOKEN not in result.stderr
    # the server asked for it once, with the token; the other place was never asked
    assert SEEN == [("api", "/api/v1/runs/events/2026-12-01T03:00?json=False", f"Bearer {TOKEN}")]


@pytest.mark.parametrize(
    "target",
    [
        "http://retention.invalid/api/v1/runs/x",  # plain http off this machine
        "https://127.0.0.1:{port}/api/v1/runs/x",  # the same host and port, another scheme
        "//retention.invalid/api/v1/runs/x",  # scheme-relative: another host
    ],
)
def test_a_redirect_to_plain_http_or_another_scheme_is_refused_before_any_connection(target):
    where = {}
    with server("api", "127.0.0.1", lambda path: target.replace("{port}", where["port"])) as url:
        where["port"] = url.rsplit(":", 1)[1]
        result = status(url)
    assert result.returncode == 1
    assert "not followed, so the token is not sent there" in result.stderr
    assert [seen[0] for seen in SEEN] == ["api"]


def test_a_redirect_within_the_servers_own_origin_is_followed():
    def moved(path: str):
        return None if path.startswith("/moved") else "/moved" + path

    with server("api", "127.0.0.1", moved) as url:
        result = status(url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "served by api\n"
    assert [(name, path) for name, path, _ in SEEN] == [
        ("api", "/api/v1/runs/events/2026-12-01T03:00?json=False"),
        ("api", "/moved/api/v1/runs/events/2026-12-01T03:00?json=False"),
    ]
