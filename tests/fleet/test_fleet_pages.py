"""The fleet on the dashboard: the overview's convergence line names the laggard (also in
headless Chromium); the target pages; a target noted unreachable is not waited on; and no
connection string's password shows anywhere — pages, API answers, logs, the control database."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection
from django.test import Client
from playwright.sync_api import expect

from runs.models import Run
from targets import connections as C
from targets.models import Target
from tests.dashboard.test_browser import browser, login  # noqa: F401 - fixtures
from tests.factories import approved_policy, events_spec
from tests.fleet.conftest import SECRET, run_cli, with_password
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
    page = client.get("/").content.decode()
    assert "converged on 2 of 3 targets" in page
    assert 'lagging: <a href="/runs/targets/shard3/">shard3</a> — active' in page

    metrics = client.get("/metrics").content.decode()
    assert 'retention_target_up{target="shard3"} 1.0' in metrics
    assert 'retention_target_converged{policy="events",target="shard1"} 1.0' in metrics
    assert 'retention_target_converged{policy="events",target="shard3"} 0.0' in metrics

    targets = client.get("/runs/targets/").content.decode()
    for name in ("default", "shard1", "shard2", "shard3"):
        assert f'data-target="{name}"' in targets
    shard1 = client.get("/runs/targets/shard1/").content.decode()
    assert two_of_three[0] in shard1 and "Drained" in shard1
    assert client.get("/runs/targets/nowhere/").status_code == 404


def test_a_target_noted_unreachable_is_not_waited_on(two_of_three, users):
    Target.objects.filter(name="shard2").update(
        unreachable_since=NOW, unreachable_reason="connection refused"
    )
    client = Client()
    client.force_login(users["viewer"])
    page = client.get("/").content.decode()
    assert "converged on 1 of 3 targets" in page
    assert "shard2</a> — unreachable: connection refused" in page
    target = client.get("/runs/targets/shard2/").content.decode()
    assert "unreachable" in target and "Not read: the target does not answer." in target


@pytest.fixture
def silent_target(two_of_three, monkeypatch):
    """A fourth target of the group whose server does not answer: a socket that accepts the
    connection and never replies (a hung server, a path that drops its replies), its connect
    timeout ten minutes long."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    monkeypatch.setenv(
        "FLEET_TEST_SILENT", f"postgresql://postgres@127.0.0.1:{port}/ledger?connect_timeout=600"
    )
    Target.objects.create(name="silent", dsn_env="FLEET_TEST_SILENT", group="shards")
    yield
    from runs.fleet import view

    listener.close()  # the connection it queued is reset: its read fails and ends
    reading = view._reading.get("silent")
    if reading is not None:
        with pytest.raises(Exception):  # noqa: B017, PT011 - whichever way libpq words it
            reading[0].result(timeout=120)


def test_a_target_that_does_not_answer_is_not_waited_for(two_of_three, silent_target, users):
    # its read would wait ten minutes for the server; the pages answer without it, naming it
    client = Client()
    client.force_login(users["viewer"])
    for _ in range(2):  # the second page finds the first page's read still waiting
        page = client.get("/").content.decode()
        assert "converged on 2 of 4 targets" in page
        assert (
            "silent</a> — unreachable: does not answer (its ledger&#x27;s read has waited" in page
        )
    tiles = client.get("/runs/targets/").content.decode()
    assert 'data-target="silent"' in tiles and "does not answer" in tiles
    target = client.get("/runs/targets/silent/").content.decode()
    assert "Not read: the target does not answer." in target
    from runs.fleet import view

    # one read of it at a time, however many pages asked
    assert not view._reading["silent"][0].done()


def test_no_password_of_a_connection_string_shows_anywhere(two_of_three, users, caplog):
    caplog.set_level(logging.DEBUG)
    client = Client()
    client.force_login(users["auditor"])
    seen = []
    for url in ("/", "/runs/targets/", "/runs/targets/shard1/", "/runs/targets/shard3/",
                "/runs/", "/runs/activity/", "/metrics"):  # fmt: skip
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
    login,  # noqa: F811
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
