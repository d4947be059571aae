"""The verification that reads only what a pass may have missed (``reconciler.missed_ranges``,
``missed_count``) is exact for the rows it is meant to find, whatever the layout of keys and
timestamps: every eligible row below the pass's first chunk or from its last chunk on — the
rows an estimated last key left out, and old rows written or aged there after the run began —
is counted, and nothing inside the done chunks is left over."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from runs.actions import trigger_run
from runs.engine import planner, reconciler, worker
from runs.models import Chunk
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW

TABLE = "rr_missed"
OLD_DAYS, YOUNG_DAYS = 35.0, 5.0  # either side of the policy's 20 days

_slugs = itertools.count()


@st.composite
def layouts(draw):
    """Initial rows ``(key, age in days)`` and the rows written after the pass's chunks are done:
    ``("above", offset, old)`` at the last chunk's lower bound + offset (an existing row there
    is overwritten: aged or made young), ``("below", offset, old)`` below the first chunk."""
    n = draw(st.integers(20, 240))
    kind = draw(st.sampled_from(["time-ordered", "random", "stragglers"]))
    if kind == "random":
        ages = draw(st.lists(st.floats(0.5, 40.0), min_size=n, max_size=n))
    else:
        ages = [40.0 * (1 - i / n) + 0.01 for i in range(n)]
        if kind == "stragglers":  # old rows among the young keys, above every other old key
            for i in draw(st.lists(st.integers(n // 2, n - 1), max_size=6)):
                ages[i] = OLD_DAYS
    rows = list(enumerate(ages, start=1))
    late = draw(
        st.lists(
            st.tuples(st.sampled_from(["above", "below"]), st.integers(0, 80), st.booleans()),
            max_size=8,
        )
    )
    estimate = draw(st.sampled_from([0, 1, 3, 10]))  # 0: the exact last key
    chunk_size = draw(st.sampled_from([10, 15, 40]))
    return kind, rows, late, estimate, chunk_size


def _sql(text: str, params=None):
    with connection.cursor() as cur:
        cur.execute(text, params or [])
        return cur.fetchall() if cur.description else None


def _create(rows) -> None:
    _sql(f"DROP TABLE IF EXISTS public.{TABLE}")
    _sql(
        f"CREATE TABLE public.{TABLE} (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " occurred_at timestamptz NOT NULL, status text NOT NULL, payload text NOT NULL)"
    )
    _sql(f"CREATE INDEX ON public.{TABLE} (occurred_at)")
    _sql(
        f"INSERT INTO public.{TABLE} SELECT k, 1, %s::timestamptz - make_interval(secs => a * 86400),"
        " 'closed', 'x' FROM unnest(%s::bigint[], %s::float8[]) AS r (k, a)",
        [NOW, [k for k, _ in rows], [a for _, a in rows]],
    )
    _sql(f"ANALYZE public.{TABLE}")


def _drain_chunks(run) -> None:
    """The pass's chunks, planned and committed one by one (no verification yet)."""
    planner.plan(run, window=100_000)
    while (outcome := worker.process_one(run)).kind != worker.NO_WORK:
        assert outcome.kind == worker.DONE, outcome


@pytest.mark.django_db(transaction=True)
def test_the_verification_of_what_a_pass_may_have_missed_finds_every_such_row(
    make_user, settings_guard_off
):
    @settings(
        max_examples=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(layout=layouts())
    def check(layout):
        kind, rows, late, estimate, chunk_size = layout
        note(f"{kind}: {len(rows)} rows, estimate from {estimate}, chunks of {chunk_size}")
        settings_guard_off.RETENTION = {
            **settings_guard_off.RETENTION, "BOUND_ESTIMATE_ROWS": estimate,
        }  # fmt: skip
        _create(rows)
        policy = approved_policy(
            make_user,
            **events_spec(
                slug=f"missed-{next(_slugs)}", table=TABLE, tenant=None, chunking="key",
                chunk_size=chunk_size, keep=[],
            ),
        )  # fmt: skip
        run, _ = trigger_run(policy, tick=NOW)
        _drain_chunks(run)
        chunks = Chunk.objects.filter(run=run, pass_no=run.pass_no)
        if not chunks.exists():
            return  # nothing eligible: no pass to verify
        first = int(chunks.order_by("seq").first().lo[0])
        last = int(chunks.order_by("-seq").first().lo[0])
        for side, offset, old in late:  # written after the run began, outside the done chunks
            key = last + offset if side == "above" else first - 1 - offset
            _sql(
                f"INSERT INTO public.{TABLE} VALUES (%s, 1, %s::timestamptz - make_interval("
                "secs => %s * 86400), 'closed', 'late') ON CONFLICT (id) DO UPDATE"
                " SET occurred_at = excluded.occurred_at",
                [key, NOW, OLD_DAYS if old else YOUNG_DAYS],
            )
        eligible = f"SELECT count(*) FROM public.{TABLE} WHERE occurred_at < %s"
        (inside,) = _sql(eligible + " AND id >= %s AND id < %s", [run.bound, first, last])[0]
        assert inside == 0  # the done chunks deleted every eligible row of their ranges
        (expected,) = _sql(eligible, [run.bound])[0]
        note(f"first chunk from {first}, last from {last}: {expected} eligible rows outside")
        found = reconciler.verify(run)
        assert "missed" in found, found["read"]  # the narrow verification, not the whole range
        assert found["remaining"] == expected
        assert (
            found["missed"]["rows_below"]
            == _sql(eligible + " AND id < %s", [run.bound, first])[0][0]
        )
        assert (
            found["missed"]["rows_from"]
            == _sql(eligible + " AND id >= %s", [run.bound, last])[0][0]
        )

    try:
        check()
    finally:
        _sql(f"DROP TABLE IF EXISTS public.{TABLE}")
        connection.close()


@pytest.fixture
def settings_guard_off(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    return settings
