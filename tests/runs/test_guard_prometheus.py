"""An external admission signal: a Prometheus query over its threshold throttles the policy's
chunks and releases them when it falls back; no answer counts as pressure once the grace
period has passed. Against a real Prometheus server (Debian's package) scraping an exporter
this test serves."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from django.db import connection
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from runs.actions import trigger_run
from runs.engine import guard, planner, prometheus, worker
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events
from tests.runs.processes import wait_for

PROMETHEUS = "/usr/bin/prometheus"
QUERY = "app_request_p99_seconds"

pytestmark = pytest.mark.skipif(
    shutil.which(PROMETHEUS) is None,
    reason="Debian's prometheus package is not installed (/usr/bin/prometheus): .ci/run installs it",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Prometheus server scraping one gauge every 200 ms from an exporter served here."""

    def __init__(self, tmp_path) -> None:
        self.registry = CollectorRegistry()
        self.gauge = Gauge(QUERY, "the application's p99 latency", registry=self.registry)
        self.gauge.set(0.1)
        exporter_port = free_port()
        self.exporter, _ = start_http_server(exporter_port, "127.0.0.1", registry=self.registry)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
            "scrape_configs:\n  - job_name: app\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{exporter_port}']\n"
        )
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self.value() is not None, timeout=60, what="Prometheus to scrape")

    def value(self) -> float | None:
        """What Prometheus answers for the query now (None: no answer or no series yet)."""
        url = f"{self.url}/api/v1/query?query={QUERY}"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                result = json.loads(response.read())["data"]["result"]
        except OSError:
            return None
        return float(result[0]["value"][1]) if result else None

    def set(self, value: float) -> None:
        """Flip the gauge and wait until Prometheus has scraped it."""
        self.gauge.set(value)
        wait_for(lambda: self.value() == value, timeout=30, what=f"Prometheus to read {value}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def close(self) -> None:
        self.stop()
        self.exporter.shutdown()


@pytest.fixture(scope="module")
def running_server(tmp_path_factory):
    """``running_server()``: the module's Prometheus server, started on first use and again
    only after a test stopped it."""
    servers: list[Server] = []

    def running() -> Server:
        if not servers or servers[-1].proc.poll() is not None:
            servers.append(Server(tmp_path_factory.mktemp("prometheus")))
        return servers[-1]

    yield running
    for s in servers:
        s.close()


@pytest.fixture
def server(running_server):
    s = running_server()
    s.set(0.1)  # every test starts from the same reading
    return s


@pytest.fixture
def table(db):
    create_events(2000)
    yield "rr_events"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_events, public.rr_events_shadow")


def active_run(make_user, **guard_keys):
    # no latency probe: the Prometheus signal is the only one this test moves
    policy = approved_policy(make_user, **events_spec(guard={"probe": "none", **guard_keys}))
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    return policy, Run.objects.get(pk=run.pk)


def test_a_prometheus_query_over_its_threshold_throttles_and_releases_admission(
    table, make_user, server
):
    policy, run = active_run(
        make_user, prometheus_url=server.url, prometheus_query=QUERY, prometheus_threshold=0.5
    )
    spec = policy.approved_version.parsed
    assert prometheus.source_of(spec).url == server.url

    guard.sample(force=True)
    first = worker.process_one(run)
    assert first.kind == worker.DONE, first.reason
    shown = guard.current_state(policy)["signals"]["prometheus"]
    assert (shown["value"], shown["threshold"]) == (0.1, 0.5)

    server.set(0.9)
    guard.sample(force=True)
    throttled = worker.process_one(Run.objects.get(pk=run.pk))
    assert throttled.kind == worker.THROTTLED
    assert throttled.reason == f"prometheus {QUERY} = 0.9 > 0.5"
    state = guard.current_state(policy)
    assert state["level"] == "throttled" and state["reasons"] == [throttled.reason]
    assert state["signals"]["prometheus"]["value"] == 0.9

    server.set(0.2)
    guard.sample(force=True)
    assert guard.evaluate(spec, guard.latest_sample()).admit
    again = worker.process_one(Run.objects.get(pk=run.pk))
    assert again.kind in (worker.DONE, worker.NO_WORK), again.reason  # throttled chunk backs off
    # the query no longer throttles: its reading is under its threshold and no reason names it
    # (the badge as a whole also reads the host's signals, which a busy machine may move)
    state = guard.current_state(policy)
    assert state["signals"]["prometheus"]["value"] == 0.2
    assert not [r for r in state["reasons"] if r.startswith("prometheus")], state["reasons"]


def test_an_unreachable_prometheus_counts_as_pressure_after_its_grace_period(
    table, make_user, server, settings
):
    settings.RETENTION = {
        **settings.RETENTION,
        "GUARD_PROMETHEUS_URL": server.url,
        "GUARD_PROMETHEUS_QUERY": QUERY,
        "GUARD_PROMETHEUS_THRESHOLD": 0.5,
        "GUARD_PROMETHEUS_TIMEOUT_MS": 500,
        "GUARD_PROMETHEUS_GRACE_S": 1,
    }  # configured for the instance, not in the policy
    policy, run = active_run(make_user)
    spec = policy.approved_version.parsed
    assert guard.evaluate(spec, guard.sample(force=True)).admit

    server.stop()
    silent = guard.sample(force=True)
    entry = next(iter(silent.values["prometheus"].values()))
    assert entry["ok"] is False and entry["error"]
    verdict = guard.evaluate(spec, silent)
    assert verdict.admit, verdict.reason  # within the grace period
    assert verdict.signals["prometheus"]["value"] is None

    time.sleep(1.1)  # the grace period passes with no answer
    later = guard.sample(force=True)
    # the silence is counted from the first unanswered sample, carried over from sample to sample
    assert (
        next(iter(later.values["prometheus"].values()))["failing_since"] == entry["failing_since"]
    )
    verdict = guard.evaluate(spec, later)
    assert not verdict.admit
    assert re.match(
        rf"prometheus at {re.escape(server.url)} gave no answer for \d+ s \(grace 1 s\): .+",
        verdict.reason,
    ), verdict.reason
    outcome = worker.process_one(Run.objects.get(pk=run.pk))
    assert outcome.kind == worker.THROTTLED and "gave no answer" in outcome.reason
