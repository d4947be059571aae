"""A table whose rows reference older rows of the same table through a foreign key that blocks
(``NO ACTION``, ``RESTRICT``, deferred): a home-automation recorder's ``old_state_id``, a chat
server's replies. A run plans the pass whole and deletes newest first, so a referencing row
goes before the row it references; each chunk spares the rows a row that stays references
(directly or through rows it spares), instead of failing and splitting down to single rows."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.engine import worker
from runs.models import Chunk, DeadLetter, Run
from tests.factories import approved_policy
from tests.runs.conftest import NOW, count

pytestmark = pytest.mark.django_db(transaction=True)


def sql(text: str, params=None) -> None:
    with connection.cursor() as cur:
        cur.execute(text, params)


@pytest.fixture(params=["NO ACTION", "RESTRICT", "NO ACTION DEFERRABLE INITIALLY DEFERRED"])
def states(request, transactional_db):
    """``public.rr_states``: 6,000 states over 40 days, each referencing the one before it
    (``old_state_id``) in runs of ten; every 500th state is pinned (kept by the policy), so
    the four states before it in its run stay with it."""
    sql("DROP TABLE IF EXISTS public.rr_states")
    sql(
        "CREATE TABLE public.rr_states (state_id bigint PRIMARY KEY, entity int NOT NULL,"
        " last_updated timestamptz NOT NULL, pinned boolean NOT NULL DEFAULT false,"
        f" old_state_id bigint REFERENCES public.rr_states (state_id) ON DELETE {request.param})"
    )
    sql(
        "INSERT INTO public.rr_states SELECT g, g %% 7,"
        " %s::timestamptz - make_interval(secs => 40 * 86400.0 * (1 - g::float8 / 6000)),"
        " g %% 500 = 5, CASE WHEN g %% 10 <> 1 THEN g - 1 END FROM generate_series(1, 6000) g",
        [NOW],
    )
    sql("CREATE INDEX ON public.rr_states (old_state_id)")
    sql("ANALYZE public.rr_states")
    sql("DROP TABLE IF EXISTS public.rr_states_shadow")
    sql("CREATE TABLE public.rr_states_shadow AS SELECT * FROM public.rr_states")
    yield request.param
    sql("DROP TABLE IF EXISTS public.rr_states, public.rr_states_shadow")


def test_rows_referencing_older_rows_drain_newest_first_and_only_what_a_kept_row_holds_stays(
    states, make_user, no_guard
):
    """What stays of the old rows is exactly what a row that stays — a pinned one, or the
    first young one of a run of ten straddling the cutoff — references, at any depth."""
    policy = approved_policy(
        make_user, slug="states", table="public.rr_states", key="state_id",
        timestamp="last_updated", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=400, keep=[{"column": "pinned", "op": "=", "value": True}],
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    old = "last_updated < %s"
    pinned_old = count("public.rr_states", f"{old} AND pinned", [run.bound])
    assert pinned_old > 3
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    # what stays of the old rows: exactly those a row that stays references, at any depth
    with connection.cursor() as cur:
        cur.execute(
            "WITH RECURSIVE stay AS (SELECT state_id, old_state_id FROM public.rr_states_shadow"
            " WHERE last_updated >= %s OR pinned UNION SELECT s.state_id, s.old_state_id"
            " FROM stay JOIN public.rr_states_shadow s ON s.state_id = stay.old_state_id)"
            " SELECT count(*) FILTER (WHERE last_updated < %s AND NOT pinned),"
            " count(*) FILTER (WHERE last_updated < %s AND pinned)"
            " FROM stay JOIN public.rr_states_shadow USING (state_id)",
            [run.bound, run.bound, run.bound],
        )
        held_by_stayers, pinned = cur.fetchone()
    assert pinned == pinned_old and held_by_stayers >= 4 * pinned_old
    assert count("public.rr_states", f"{old} AND NOT pinned", [run.bound]) == held_by_stayers
    assert count("public.rr_states", f"{old} AND pinned", [run.bound]) == pinned_old
    young = count("public.rr_states_shadow", "last_updated >= %s", [run.bound])
    assert count("public.rr_states", "last_updated >= %s", [run.bound]) == young
    # no chunk failed: none was split, nothing dead-lettered for a row a stayer references
    assert not Chunk.objects.filter(run=run, state=Chunk.State.SPLIT).exists()
    assert not DeadLetter.objects.filter(run=run).exists()
    assert run.state == Run.State.DRAINED, run.state_reason
    # the cause named once per key, not once per row: the rows that stay and reference an old
    # row directly, and one of them
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM public.rr_states_shadow r JOIN public.rr_states_shadow o"
            " ON o.state_id = r.old_state_id WHERE (r.last_updated >= %s OR r.pinned)"
            " AND o.last_updated < %s AND NOT o.pinned",
            [run.bound, run.bound],
        )
        direct = cur.fetchone()[0]
    (cause,) = run.verification["kept_referenced_by"]
    assert (cause["rows"], cause["referencing"]) == (direct, direct)
    assert cause["table"] == "public.rr_states" and cause["columns"] == ["old_state_id"]
    stayer, old_row = re.fullmatch(
        r"state_id = (\d+) references state_id = (\d+)", cause["example"]
    ).groups()
    assert (
        count(
            "public.rr_states_shadow",
            "state_id = %s AND old_state_id = %s AND (last_updated >= %s OR pinned)",
            [stayer, old_row, run.bound],
        )
        == 1
    )
    assert run.state_reason == (
        f"verified: no eligible row left; {held_by_stayers:,} row(s) kept: referenced by a row "
        f"that stays ({cause['constraint']} on public.rr_states (old_state_id): {direct:,} row(s)"
        f" that stay reference {direct:,} directly, e.g. {cause['example']})"
    )


def test_a_reference_committed_while_its_chunk_deletes_the_row_costs_one_failed_chunk(
    states, make_user, no_guard
):
    """The application inserts a young state referencing an old one (1203) in a transaction
    still open while the chunk that deletes 1203 runs: the DELETE waits for it, and once it
    commits PostgreSQL's check of the key finds the new reference and fails the chunk (23503,
    23001 for RESTRICT). That one cause costs one failed chunk and no dead letter: the chunk is
    split once, and its halves, reading the table again, spare 1203 and the states it
    references (1202, 1201) — no splitting down to single rows. Everything else the rows that
    stay do not reference goes, and the run is drained."""
    from tests.runs.processes import drain_past_an_open_write, pg_connect

    policy = approved_policy(
        make_user, slug="states", table="public.rr_states", key="state_id",
        timestamp="last_updated", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=400, keep=[{"column": "pinned", "op": "=", "value": True}],
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    # 1201..1210 are one run of ten, old, none pinned: without the new reference all go
    assert count("public.rr_states", "state_id BETWEEN 1201 AND 1210 AND last_updated < %s"
                 " AND NOT pinned", [run.bound]) == 10  # fmt: skip
    application = pg_connect(autocommit=False)
    try:
        # checked at once, so the insert holds 1203's key-share lock until it commits (a
        # deferred key's check would take it only at COMMIT)
        application.execute("SET CONSTRAINTS ALL IMMEDIATE")
        application.execute(
            "INSERT INTO public.rr_states (state_id, entity, last_updated, old_state_id)"
            " VALUES (99999, 1, %s, 1203)",
            [NOW],
        )
        drain_past_an_open_write(application, run.pk)
    finally:
        application.close()
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    # one failed chunk for the one cause, split once; no dead letter
    failed = Chunk.objects.filter(run=run, last_sqlstate__startswith="23")
    sqlstate = "23001" if states == "RESTRICT" else "23503"
    assert [(c.state, c.last_sqlstate) for c in failed] == [(Chunk.State.SPLIT, sqlstate)]
    assert Chunk.objects.filter(run=run, state=Chunk.State.SPLIT).count() == 1
    assert min(Chunk.objects.filter(run=run).values_list("planned_rows", flat=True)) > 1
    assert not DeadLetter.objects.filter(run=run).exists()
    # what stays of the old rows: exactly those a row that stays references, the new one too
    sql("INSERT INTO public.rr_states_shadow SELECT * FROM public.rr_states WHERE state_id = 99999")
    with connection.cursor() as cur:
        cur.execute(
            "WITH RECURSIVE stay AS (SELECT state_id, old_state_id FROM public.rr_states_shadow"
            " WHERE last_updated >= %s OR pinned UNION SELECT s.state_id, s.old_state_id"
            " FROM stay JOIN public.rr_states_shadow s ON s.state_id = stay.old_state_id)"
            " SELECT count(*) FROM stay JOIN public.rr_states_shadow USING (state_id)"
            " WHERE last_updated < %s AND NOT pinned",
            [run.bound, run.bound],
        )
        held_by_stayers = cur.fetchone()[0]
    assert count("public.rr_states", "state_id BETWEEN 1201 AND 1210") == 3
    assert count("public.rr_states", "state_id IN (1201, 1202, 1203)") == 3
    assert count("public.rr_states", "last_updated < %s AND NOT pinned", [run.bound]) == (
        held_by_stayers
    )
    assert f"{held_by_stayers:,} row(s) kept: referenced by a row that stays" in run.state_reason
