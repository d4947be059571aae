"""The verification that reads only what a pass may have missed (``reconciler.missed_ranges``,
``missed_count``) is exact for the rows it is meant to find, whatever the layout of keys and
timestamps: every eligible row below the pass's first chunk or from its last chunk on — the
rows an estimated last key left out, and old rows written or aged there after the run began —
is counted, and nothing inside the done chunks is left over.

With the read above the walk's last key taken early, while chunks are still deleted
(``reconciler.read_above``), the same holds but for exactly what docs/engine.md says it does
not look for: a row made eligible by a write after that read, with a key between the walk's
last key and the highest key the read saw. Old rows inserted above that key after it, and
rows written before it, are found."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import User
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
    """Initial rows ``(key, age in days)`` and the rows written after the chunks were planned:
    ``("above", offset, old, after)`` at the last chunk's lower bound + offset (an existing row
    there is overwritten: aged or made young), ``("below", …)`` below the first chunk,
    ``("top", …)`` above the table's highest key (a new row of a key in time order); ``after``:
    written after the early read (else before it, while chunks are still to go). ``early``:
    None (no early read), else the share of the chunks done before it."""
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
            st.tuples(
                st.sampled_from(["above", "below", "top"]),
                st.integers(0, 80),
                st.booleans(),
                st.booleans(),
            ),
            max_size=8,
        )
    )
    estimate = draw(st.sampled_from([0, 1, 3, 10]))  # 0: the exact last key
    chunk_size = draw(st.sampled_from([10, 15, 40]))
    early = draw(st.sampled_from([None, 0.0, 0.5, 1.0]))
    return kind, rows, late, estimate, chunk_size, early


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


def _drain_chunks(run, count: int | None = None) -> None:
    """``count`` of the pass's chunks (default all), committed one by one (no verification)."""
    done = 0
    while count is None or done < count:
        outcome = worker.process_one(run)
        if outcome.kind == worker.NO_WORK:
            return
        assert outcome.kind == worker.DONE, outcome
        done += 1


def _write(key: int, old: bool) -> None:
    _sql(
        f"INSERT INTO public.{TABLE} VALUES (%s, 1, %s::timestamptz - make_interval("
        "secs => %s * 86400), 'closed', 'late') ON CONFLICT (id) DO UPDATE"
        " SET occurred_at = excluded.occurred_at",
        [key, NOW, OLD_DAYS if old else YOUNG_DAYS],
    )


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
        kind, rows, late, estimate, chunk_size, early = layout
        note(
            f"{kind}: {len(rows)} rows, estimate from {estimate}, chunks of {chunk_size},"
            f" early read after {early} of the chunks"
        )
        settings_guard_off.RETENTION = {
            **settings_guard_off.RETENTION, "BOUND_ESTIMATE_ROWS": estimate,
        }  # fmt: skip
        _create(rows)
        policy = approved_policy(
            the_same_people,
            **events_spec(
                slug=f"missed-{next(_slugs)}", table=TABLE, tenant=None, chunking="key",
                chunk_size=chunk_size, keep=[],
            ),
        )  # fmt: skip
        run, _ = trigger_run(policy, tick=NOW)
        planner.plan(run, window=100_000)  # the walk reaches its last key
        chunks = Chunk.objects.filter(run=run, pass_no=run.pass_no)
        if not chunks.exists():
            return  # nothing eligible: no pass to verify
        first = int(chunks.order_by("seq").first().lo[0])
        last = int(chunks.order_by("-seq").first().lo[0])
        _drain_chunks(run, None if early is None else round(early * chunks.count()))

        def written(after: bool) -> list[tuple[int, bool]]:
            keys = []
            for side, offset, old, later in late:  # outside the done chunks
                if later != after:
                    continue
                if side == "top":
                    key = _sql(f"SELECT max(id) FROM public.{TABLE}")[0][0] + 1 + offset
                else:
                    key = last + offset if side == "above" else first - 1 - offset
                _write(key, old)
                keys.append((key, old))
            return keys

        written(after=False)
        record = then = None
        if early is not None:
            record = reconciler.read_above(run)
            assert record is not None
            (top,) = _sql(f"SELECT max(id) FROM public.{TABLE}")[0]
            assert record["top"] == [str(top)]
            bound = int(record["last"][0])
            then = {  # the eligible keys above the walk's last key when the early read ran
                k
                for (k,) in _sql(
                    f"SELECT id FROM public.{TABLE} WHERE occurred_at < %s AND id > %s",
                    [run.bound, bound],
                )
            }
            if record["found"] is not None:
                assert {int(k[0]) for k in record["found"]} == then
            _drain_chunks(run)
        backdated = written(after=True)
        eligible = f"SELECT count(*) FROM public.{TABLE} WHERE occurred_at < %s"
        (inside,) = _sql(eligible + " AND id >= %s AND id < %s", [run.bound, first, last])[0]
        assert inside == 0  # the done chunks deleted every eligible row of their ranges
        (expected,) = _sql(eligible, [run.bound])[0]
        note(f"first chunk from {first}, last from {last}: {expected} eligible rows outside")
        # not looked for after an early read: made eligible by a write after it, with a key
        # between the walk's last key and the highest key the read saw
        unlooked = set()
        if record is not None and record["found"] is not None:
            unlooked = {
                k
                for (k,) in _sql(
                    f"SELECT id FROM public.{TABLE} WHERE occurred_at < %s AND id > %s AND id < %s",
                    [run.bound, bound, top],
                )
            } - then
            assert unlooked <= {k for k, old in backdated if old}, unlooked
        note(f"not looked for: {sorted(unlooked)}")
        found = reconciler.verify(run)
        assert "missed" in found, found["read"]  # the narrow verification, not the whole range
        assert ("read_above" in found) == (record is not None and record["found"] is not None)
        assert found["remaining"] == expected - len(unlooked)
        assert (
            found["missed"]["rows_below"]
            == _sql(eligible + " AND id < %s", [run.bound, first])[0][0]
        )
        assert found["missed"]["rows_from"] == _sql(eligible + " AND id >= %s", [run.bound, last])[
            0
        ][0] - len(unlooked)

    def the_same_people(username: str, *roles: str):
        """One author and one approver for every example's policy: a new person per example
        would cost a password hash each (PBKDF2, by design slow), most of the file's time."""
        name = username.split("-", 1)[0]  # "author-missed-3" → "author"
        return User.objects.filter(username=name).first() or make_user(name, *roles)

    try:
        check()
    finally:
        _sql(f"DROP TABLE IF EXISTS public.{TABLE}")
        connection.close()


@pytest.fixture
def settings_guard_off(settings):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    return settings
