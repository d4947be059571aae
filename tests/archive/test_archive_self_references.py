"""An archiving policy on a table whose rows reference older rows of the same table: the rows
a row that stays references are spared — neither archived nor deleted — as without archive."""

from __future__ import annotations

import pyarrow.parquet as pq
from django.db import connection

from runs.actions import trigger_run
from runs.engine import worker
from runs.models import AuditRecord, Run
from tests.factories import approved_policy
from tests.runs.conftest import count
from tests.runs.test_self_references import NOW, states  # noqa: F401 (the fixture)


def test_an_archiving_run_spares_and_keeps_out_of_the_archive_what_a_staying_row_references(
    states,  # noqa: F811
    make_user,
    no_guard,
    tmp_path,
):
    policy = approved_policy(
        make_user, slug="states", table="public.rr_states", key="state_id",
        timestamp="last_updated", retention="20 days", schedule="0 3 * * *", timezone="UTC",
        chunk_size=400, keep=[{"column": "pinned", "op": "=", "value": True}],
        archive={"to": f"file://{tmp_path}"},
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    before = count("public.rr_states")
    worker.drain(run.pk, budget_s=120)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    with connection.cursor() as cur:
        cur.execute(
            "SELECT s.state_id FROM public.rr_states_shadow s"
            " WHERE NOT EXISTS (SELECT 1 FROM public.rr_states t WHERE t.state_id = s.state_id)"
        )
        gone = sorted(r[0] for r in cur.fetchall())
    archived = sorted(
        i
        for f in tmp_path.rglob("*.parquet")
        for i in pq.read_table(f, columns=["state_id"]).column("state_id").to_pylist()
    )
    assert gone and archived == gone  # exactly the rows deleted, each once
    assert before - count("public.rr_states") == len(gone)
    assert sum(r.rows_deleted for r in AuditRecord.objects.filter(run=run)) == len(gone)
    # a row that stays still finds the row it references
    assert (
        count(
            "public.rr_states s",
            "s.old_state_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM public.rr_states o"
            " WHERE o.state_id = s.old_state_id)",
        )
        == 0
    )
