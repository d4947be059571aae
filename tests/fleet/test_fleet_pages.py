"""The fleet on the dashboard: the overview's convergence line names the laggard and a policy's
page lists its targets with their runs (also in headless Chromium); the target pages; no page
waits on a target, whether noted unreachable or silent; and no connection string's password
shows anywhere — pages, API answers, logs, the control database."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from runs.models import Run
from targets import connections as C
from targets.models import Target
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import SECRET, read_page, run_cli, with_password
from tests.runs.conftest import NOW, create_events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def users(make_user):
    return {role: make_user(f"{role}-user", role) for role in ("viewer", "oncall", "auditor")}


@pytest.fixture
def two_of_three(fleet, make_user, act_as, no_guard, monkeypatch):
    """Connection strings with a password; ``events`` over the three shards, drained on two."""
    for target in fleet:
        monkeypatch.setenv(target.env, with_password(target.url))
        with C.on(target.name):
            create_events(600, days=40)
    C.close_all()
    approved_policy(make_user, **events_spec(targets=["group:shards"], chunk_size=200))
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "events", "--period", NOW.date().isoformat()).split()
    for key in keys[:2]:
        run_cli("drain", key, "--until-idle")
    return keys


def test_the_overview_names_the_laggard_and_the_target_pages_answer(two_of_three, users):
    client = Client()
    client.force_login(users["viewer"])
    page = read_page(client, "/")
    assert "converged on 2 of 3 targets" in page
    assert 'lagging: <a href="/runs/targets/shard3/">shard3</a> — active' in page

    metrics = client.get("/metrics").content.decode()
    assert 'retention_target_up{target="shard3"} 1.0' in metrics
    assert 'retention_target_converged{policy="events",target="shard1"} 1.0' in metrics
    assert 'retention_target_converged{policy="events",target="shard3"} 0.0' in metrics

    targets = read_page(client, "/runs/targets/")
    for name in ("default", "shard1", "shard2", "shard3"):
        assert f'data-target="{name}"' in targets
    assert targets.count('<span class="badge ok">answers</span>') == 4
    shard1 = read_page(client, "/runs/targets/shard1/")
    assert two_of_three[0] in shard1 and "Drained" in shard1
    assert client.get("/runs/targets/nowhere/").status_code == 404


def test_a_target_noted_unreachable_is_not_waited_on(two_of_three, users):
    Target.objects.filter(name="shard2").update(
        unreachable_since=NOW, unreachable_reason="connection refused"
    )
    client = Client()
    client.force_login(users["viewer"])
    page = read_page(client, "/")
    assert "converged on 1 of 3 targets" in page
    assert "shard2</a> — unreachable: connection refused" in page
    target = client.get("/runs/targets/shard2/").content.decode()
    assert "unreachable" in target and "Not read: the target does not answer." in target


def test_the_policy_page_lists_each_target_with_its_run(two_of_three, users):
    client = Client()
    client.force_login(users["viewer"])
    page = client.get("/policies/events/").content.decode()
    # the page itself reads no ledger: its targets load after it, from the fleet's fragment
    assert 'hx-get="/runs/fleet/events/" hx-trigger="load"' in page
    assert "Reading the targets…" in page and two_of_three[0] not in page

    fleet = read_page(client, "/runs/fleet/events/", HTTP_HX_REQUEST="true")
    assert "converged on 2 of 3 targets" in fleet
    assert 'lagging: <a href="/runs/targets/shard3/">shard3</a> — active' in fleet
    states = dict(re.findall(r'data-target="(\w+)" data-state="(\w+)"', fleet))
    assert states == {"shard1": "drained", "shard2": "drained", "shard3": "active"}
    for key in two_of_three:
        assert key in fleet
    # a drained target's progress, from its ledger (runs.progress)
    drained = re.search(r'data-target="shard1".*?</li>', fleet).group(0)
    assert "100% ·" in drained and "rows deleted" in drained
    # each target's backlog age, measured on its own table (the oldest eligible row's age past
    # the cutoff as of now): the undrained target is further behind than the drained ones
    behind = {
        name: float(days) * 86400 + float(hours) * 3600
        for name, days, hours in re.findall(
            r'data-target="(\w+)".*?data-testid="target-backlog">backlog (\d+)d (\d+)h behind<',
            fleet,
        )
    }
    assert sorted(behind) == ["shard1", "shard2", "shard3"], fleet
    now = timezone.now()
    for target in ("shard1", "shard2", "shard3"):
        with C.on(target):
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT min(occurred_at) FROM public.rr_events WHERE status <> 'disputed'"
                    " AND occurred_at < %s",
                    [now - timedelta(days=20)],
                )
                oldest = cur.fetchone()[0]
        expected = ((now - timedelta(days=20)) - oldest).total_seconds()
        assert abs(behind[target] - expected) <= 3600 + 60, (target, behind, expected)
    assert behind["shard3"] > behind["shard1"]
    # the same piece the overview shows in the policy's card
    overview = read_page(client, "/?policy=events")
    assert re.findall(r'data-target="(\w+)" data-state="(\w+)"', overview) == list(states.items())


def test_a_fleet_policy_s_backlog_is_not_read_from_a_table_of_its_name_on_the_control_database(
    two_of_three, users
):
    create_events(300, days=40)  # the control database's own public.rr_events: not the policy's
    client = Client()
    client.force_login(users["viewer"])
    page = read_page(client, "/?policy=events")
    assert "converged on 2 of 3 targets" in page
    backlog = re.search(r'data-testid="backlog-age">(.*?)</dd>', page).group(1)
    assert backlog == "none", backlog


def test_a_policy_over_the_control_database_only_has_no_targets_section(fleet, make_user, users):
    create_events(10, days=40)
    approved_policy(make_user, **events_spec())
    client = Client()
    client.force_login(users["viewer"])
    assert 'id="targets"' not in client.get("/policies/events/").content.decode()
    fleet_part = client.get("/runs/fleet/events/").content.decode()
    assert "Runs on the control database only" in fleet_part
    assert client.get("/runs/fleet/nowhere/").status_code == 404


@pytest.fixture
def silent_target(two_of_three, monkeypatch):
    """A fourth target of the group whose server does not answer: a socket that accepts each
    connection and never replies (a hung server, a path that drops its replies), its connect
    timeout ten minutes long. Yields the connections accepted so far (a list)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # held open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    monkeypatch.setenv(
        "FLEET_TEST_SILENT", f"postgresql://postgres@127.0.0.1:{port}/ledger?connect_timeout=600"
    )
    Target.objects.create(name="silent", dsn_env="FLEET_TEST_SILENT", group="shards")
    yield accepted
    from runs.fleet import view

    reads = [read for (name, _), read in view._reads.items() if name == "silent"]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()  # its reads fail and end
    listener.close()
    for read in reads:
        with pytest.raises(Exception):  # noqa: B017, PT011 - whichever way libpq words it
            read.future.result(timeout=120)


def test_a_target_that_does_not_answer_is_not_waited_for(two_of_three, silent_target, users):
    # its read would wait ten minutes for the server: every page answers without it
    client = Client()
    client.force_login(users["viewer"])
    first = client.get("/").content.decode()
    assert "converged on 0 of 4 targets" in first  # nothing read yet, nothing waited for
    assert 'data-target="silent" data-state="reading"' in first
    assert 'data-target="shard1" data-state="reading"' in first
    # a second later the others are read and it is named: it does not answer
    page = read_page(client, "/", silent=("silent",))
    assert "converged on 2 of 4 targets" in page
    assert "silent</a> — unreachable: does not answer (its ledger&#x27;s read has waited" in page
    for _ in range(3):
        assert "does not answer" in client.get("/", HTTP_HX_REQUEST="true").content.decode()
    fleet = client.get("/runs/fleet/events/").content.decode()
    assert 'data-target="silent" data-state="unreachable"' in fleet
    tiles = client.get("/runs/targets/").content.decode()
    assert 'data-target="silent"' in tiles and "does not answer" in tiles
    # one connection attempt for every page that asked about its runs, not one per page
    assert len(silent_target) == 1

    target = client.get("/runs/targets/silent/").content.decode()
    assert "reading its ledger…" in target  # its page's own read: started, not waited for
    target = read_page(client, "/runs/targets/silent/", silent=("silent",))
    assert "Not read: the target does not answer." in target
    assert len(silent_target) == 2  # and one more for its page's read, however often asked
    from runs.fleet import view

    assert all(not read.future.done() for (n, _), read in view._reads.items() if n == "silent")


def test_a_target_whose_server_hangs_up_is_noted_after_one_attempt(
    two_of_three, users, monkeypatch
):
    """A server that closes every connection at once: its one read fails, the registry notes
    it, and no page connects to it again (a new connection that failed is not tried twice)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    accepted = [0]
    stop = threading.Event()

    def hang_up() -> None:
        while not stop.is_set():
            try:
                listener.accept()[0].close()
            except OSError:
                continue
            accepted[0] += 1

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    monkeypatch.setenv(
        "FLEET_TEST_CLOSING",
        f"postgresql://postgres@127.0.0.1:{port}/ledger?sslmode=disable&gssencmode=disable",
    )
    Target.objects.create(name="closing", dsn_env="FLEET_TEST_CLOSING", group="shards")
    try:
        client = Client()
        client.force_login(users["viewer"])
        page = read_page(client, "/", silent=("closing",))
        assert 'data-target="closing" data-state="unreachable"' in page
        for _ in range(3):
            client.get("/")
            client.get("/runs/targets/")
        closing = Target.objects.get(name="closing")
        assert closing.unreachable_since is not None and closing.unreachable_reason
        assert accepted[0] == 1
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_no_password_of_a_connection_string_shows_anywhere(two_of_three, users, caplog):
    caplog.set_level(logging.DEBUG)
    client = Client()
    client.force_login(users["auditor"])
    seen = []
    for url in ("/", "/runs/targets/", "/runs/targets/shard1/", "/runs/targets/shard3/",
                "/runs/fleet/events/", "/policies/events/"):  # fmt: skip
        seen.append(read_page(client, url))
    for url in ("/runs/", "/runs/activity/", "/metrics"):
        response = client.get(url)
        assert response.status_code in (200, 403), url
        seen.append(response.content.decode())
    seen.append(run_cli("target", "list"))
    seen.append(run_cli("audit", "verify"))
    for key in two_of_three:
        seen.append(run_cli("status", key, "--json"))
    seen.append(caplog.text)
    assert all(SECRET not in text for text in seen)
    # the control database: every column of every table of the product, as text
    with connection.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
        tables = [r[0] for r in cur.fetchall()]
        for table in tables:
            cur.execute(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', [f"%{SECRET}%"])
            assert cur.fetchone()[0] == 0, table
    assert tables and "targets_target" in tables
    # and the ledgers: the engine wrote nothing of it there either
    with C.on("shard1"):
        assert Run.objects.filter(run_key=two_of_three[0]).exists()
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM runs_auditrecord a WHERE a::text LIKE %s", [f"%{SECRET}%"]
            )
            assert cur.fetchone()[0] == 0
    json.dumps(seen)  # everything read was text


@pytest.mark.browser
def test_the_fleet_overview_in_a_browser_names_the_laggard(
    two_of_three,
    login,
    live_server,
):
    page = login("viewer")
    page.goto(f"{live_server.url}/")
    card = page.locator('[data-policy="events"] [data-testid="fleet"]')
    expect(card.locator('[data-testid="fleet-converged"]')).to_have_text(
        "converged on 2 of 3 targets"
    )
    laggard = card.locator('[data-testid="laggard"]')
    expect(laggard).to_have_count(1)
    expect(laggard).to_contain_text("shard3")
    laggard.locator("a").click()
    expect(page.locator("h1")).to_have_text("Target shard3")
    expect(page.locator('[data-testid="target-runs"]')).to_contain_text(two_of_three[2])
    assert SECRET not in page.content()

    # the policy's page: its targets load after it, each with its latest run there
    page.goto(f"{live_server.url}/policies/events/")
    fleet = page.locator('[data-testid="fleet"]')
    expect(fleet.locator('[data-testid="fleet-converged"]')).to_have_text(
        "converged on 2 of 3 targets", timeout=30_000
    )
    for name, state in (("shard1", "drained"), ("shard2", "drained"), ("shard3", "active")):
        tile = fleet.locator(f'li[data-target="{name}"]')
        expect(tile).to_have_attribute("data-state", state)
        expect(tile.locator(".badge")).to_have_text(state)
    expect(fleet.locator('li[data-target="shard1"]')).to_contain_text("100%")
    expect(fleet.locator('[data-testid="laggard"]')).to_contain_text("shard3")
    fleet.locator('li[data-target="shard2"] a').click()
    expect(page.locator("h1")).to_have_text("Target shard2")
    expect(page.locator('[data-testid="target-runs"]')).to_contain_text(
        two_of_three[1], timeout=30_000
    )
