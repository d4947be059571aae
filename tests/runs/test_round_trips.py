"""Round trips per chunk: the worker's connection goes through a TCP proxy that counts the turns
of the conversation (the client speaks after the server did: one round trip), and a Django
execute wrapper lists the statements sent. A chunk that commits costs five round trips
(docs/engine.md, "Transactions"): the claim, BEGIN, the fences and admission, the DELETE and
chain head, the audit row and COMMIT; the guard adds one small read."""

from __future__ import annotations

import selectors
import socket
import threading

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from retention import predicate as P
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.evidence.invariants import check_run
from runs.models import AuditRecord, Chunk, DeadLetter, GuardSample, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events, pin_one_eligible_row

pytestmark = pytest.mark.django_db(transaction=True)


FLUSH = b"H\x00\x00\x00\x04"  # the protocol's Flush message: no answer of its own


class TurnCounter:
    """A proxy between the worker's connection and PostgreSQL. ``turns`` counts, while
    ``counting``, the times the client sends after the server answered its last request
    (ReadyForQuery, the end of every simple query and of every Sync) or before any request:
    the round trips. Statements pipelined before one Sync are one turn however they are written
    to the socket, and a server that flushes part of its answer early (a notice is sent at
    once, with whatever results are buffered before it) while a slow client is still writing
    its pipeline does not make a second one. Nor does a Flush alone: psycopg ends a pipeline
    with a Sync and then, in a write of its own, a Flush that asks for no answer — a server
    quick enough answers the Sync between the two, and the Flush is not a request."""

    def __init__(self, upstream) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.turns = 0
        self.counting = False
        self.answered = True  # the server's last complete message was a ReadyForQuery
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        family, address = self.upstream
        server = socket.socket(family, socket.SOCK_STREAM)
        server.connect(address)
        return server

    def _relay(self, client: socket.socket) -> None:
        server = self._connect_upstream()
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        # the server's messages as they stream by: a type byte and a length that counts
        # itself (the proxy starts at the startup reply: SSL and GSS are off, so no bare byte)
        pending = b""  # the start of a message whose header is not complete yet
        left = 0  # the bytes of the current message still to come
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if key.fileobj is client:
                        if data.replace(FLUSH, b""):  # a request, not only Flush messages
                            if self.answered and self.counting:
                                self.turns += 1
                            self.answered = False
                    else:
                        pending, left = self._read_server(pending + data, left)
                    key.data.sendall(data)
        finally:
            client.close()
            server.close()

    def _read_server(self, data: bytes, left: int) -> tuple[bytes, int]:
        """Walk the server's bytes message by message; the answer is complete when the last
        whole message is a ReadyForQuery (``Z``) and nothing follows it."""
        at = min(left, len(data))
        left -= at
        while at < len(data):
            if len(data) - at < 5:
                self.answered = False
                return data[at:], 0
            kind, length = data[at : at + 1], int.from_bytes(data[at + 1 : at + 5], "big")
            self.answered = kind == b"Z"
            end = at + 1 + length
            at, left = min(end, len(data)), max(0, end - len(data))
        if left:
            self.answered = False
        return b"", left

    def close(self) -> None:
        self._stop = True
        self.listener.close()


@pytest.fixture
def proxied():
    """Django's connection through a ``TurnCounter`` (restored afterwards)."""
    connection.ensure_connection()
    info = connection.connection.info
    if info.host.startswith("/"):
        upstream = (socket.AF_UNIX, f"{info.host}/.s.PGSQL.{info.port}")
    else:
        upstream = (socket.AF_INET, (info.hostaddr or info.host, info.port))
    counter = TurnCounter(upstream)
    saved = dict(connection.settings_dict)
    saved_options = dict(saved["OPTIONS"])
    connection.close()
    options = {k: v for k, v in saved_options.items() if k != "hostaddr"}
    options.update(sslmode="disable", gssencmode="disable")
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(counter.port), OPTIONS=options)
    try:
        yield counter
    finally:
        connection.close()
        connection.settings_dict.update(saved, OPTIONS=saved_options)
        counter.close()


@pytest.fixture
def guard(request, monkeypatch):
    """The guard on or off; on, its sample stays fresh and its controller's next step is not
    due for the whole test, however slow the machine (a step is a read and a write of its own)."""
    monkeypatch.setattr(
        settings,
        "RETENTION",
        {
            **settings.RETENTION,
            "GUARD": request.param,
            "GUARD_SAMPLE_MS": 60_000,
            "GUARD_CONTROL_PERIOD_MS": 60_000,
        },
    )
    return request.param


def one_chunk(counter: TurnCounter, run: Run) -> tuple[worker.Outcome, int, list[str]]:
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(" ".join(str(sql).split())[:70])
        return execute(sql, params, many, context)

    counter.turns = 0
    # the connection is idle: whatever the client sends next starts a round trip, even if
    # its last message before counting (one the server does not answer) was the client's
    counter.answered = True
    counter.counting = True
    try:
        with connection.execute_wrapper(record):
            outcome = worker.process_one(run)
    finally:
        counter.counting = False
    return outcome, counter.turns, statements


@pytest.mark.parametrize("guard", [False, True], indirect=True, ids=["guard off", "guard on"])
@pytest.mark.parametrize("chunking", ["tenant", "key"])
def test_a_chunk_commits_in_five_round_trips_and_the_guard_adds_one_read(
    make_user, proxied, guard, chunking
):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec(chunking=chunking))
    run, _ = trigger_run(policy, tick=NOW)
    run = Run.objects.select_related("policy_version", "policy").get(pk=run.pk)
    planner.plan(run)
    planner.plan(run)  # the planner done: the claims need not count pending chunks
    assert run.planner_done
    for i in range(4 * P._MAX_SCOPES):  # a process that served many runs keeps their facts
        with P.cached_types(("another run", i // 4)):
            P.scoped(("fact", i % 4), lambda: None)
    warm = worker.process_one(run)  # the catalog's column types, the guard's first sample
    assert warm.kind == worker.DONE, warm

    outcome, turns, statements = one_chunk(proxied, run)

    assert outcome.kind == worker.DONE, outcome
    assert outcome.rows > 0
    assert turns == (6 if guard else 5), "\n".join(statements)
    # statements: the claim; the fences and admission; savepoint, DELETE, release, chain lock,
    # chain head; audit row, chunk done, COMMIT (and the guard's one read)
    assert len(statements) == (13 if guard else 12), "\n".join(statements)
    assert AuditRecord.objects.filter(chunk_id=outcome.chunk_id).count() == 1
    assert Chunk.objects.get(pk=outcome.chunk_id).state == Chunk.State.DONE
    if guard:
        assert GuardSample.objects.count() == 1  # one sample, reused

    stats = worker.drain(run.pk, budget_s=60)
    assert stats["stopped"] == "no work left", stats
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


def test_the_drain_counts_pending_chunks_only_when_it_cannot_know_them(make_user, monkeypatch):
    """While the planner is not done, each claim counts the run's pending chunks in its own
    statement: the drain loop does not count them again before every chunk."""
    create_events(12000)
    monkeypatch.setattr(
        settings, "RETENTION", {**settings.RETENTION, "GUARD": False, "PLANNER_WINDOW": 6}
    )
    policy = approved_policy(make_user, **events_spec(chunk_size=100))
    run, _ = trigger_run(policy, tick=NOW)
    planning = []
    real_plan = planner.plan

    def plan(*args, **kwargs):
        planning.append(True)
        try:
            return real_plan(*args, **kwargs)
        finally:
            planning[-1] = False

    monkeypatch.setattr(planner, "plan", plan)
    counts = []  # the drain loop's own counts of pending chunks (planner.plan counts too)

    def record(execute, sql, params, many, context):
        if str(sql).startswith('SELECT COUNT(*) AS "__count" FROM "runs_chunk"') and not (
            planning and planning[-1]
        ):
            counts.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        stats = worker.drain(run.pk, budget_s=120)
    assert stats["stopped"] == "no work left", stats
    assert len(planning) >= 3 and stats["chunks"] >= 10, (len(planning), stats)
    assert len(counts) <= 1, (len(counts), len(planning), stats["chunks"])
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    assert check_run(run, shadow=("public", "rr_events_shadow")) == []


def test_without_pipeline_mode_the_same_statements_go_one_by_one_and_a_failed_delete_is_recorded(
    make_user, proxied, monkeypatch
):
    """A libpq without pipeline mode (before 14): each statement is its own round trip, and a
    DELETE that fails still rolls back to its savepoint and is recorded in the transaction."""
    monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    monkeypatch.setattr(settings, "RETENTION", {**settings.RETENTION, "GUARD": False})
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    run, _ = trigger_run(policy, tick=NOW)
    run = Run.objects.select_related("policy_version", "policy").get(pk=run.pk)
    planner.plan(run)
    assert worker.process_one(run).kind == worker.DONE

    outcome, turns, statements = one_chunk(proxied, run)
    assert outcome.kind == worker.DONE, outcome
    assert len(statements) == 12, statements
    assert turns == len(statements) + 1, "\n".join(statements)  # and psycopg's BEGIN

    chunk = Chunk.objects.filter(run=run, state=Chunk.State.PENDING).order_by("seq", "id").first()
    pin_one_eligible_row(chunk, run.cutoff)  # a child row pins one eligible row of the chunk
    try:
        stats = worker.drain(run.pk, budget_s=120, until_idle=True)
        run.refresh_from_db()
        assert run.state == Run.State.ATTENTION, (run.state_reason, stats)
        letter = DeadLetter.objects.get(run=run)
        assert (
            letter.error_class == "permanent" and letter.chunk.key_to - letter.chunk.key_from == 1
        )
        assert not AuditRecord.objects.filter(chunk=letter.chunk).exists()
        assert check_run(run, shadow=("public", "rr_events_shadow"), expect_drained=False) == []
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_child")
