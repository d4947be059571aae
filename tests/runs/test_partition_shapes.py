"""Partitioned tables of shapes the partition step was not designed around: objects that
depend on a partition (a view, a foreign key to the partition itself), row-level DELETE
triggers, a bound equal to the cutoff, a date partition key, quoted names, NULLs in the
default partition. Each run drains and ``check_run`` agrees with the shadow copy; what a
drop would bypass or cannot do leaves the partition to the chunks. docs/engine.md,
"Partitions"."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.actions import trigger_run
from runs.invariants import check_run
from runs.models import PartitionAction, Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, count
from tests.runs.test_partitions import EXPIRED, drain, parts, parts_spec, relation_exists

pytestmark = [pytest.mark.django_db(transaction=True)]
__all__ = ["parts"]

SHADOW = ("public", "rr_parts_shadow")


def sql(*statements: str) -> None:
    with connection.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def dropped(run: Run) -> list[str]:
    return sorted(
        PartitionAction.objects.filter(run=run, state="dropped").values_list("name", flat=True)
    )


def test_a_view_on_an_expired_partition_leaves_it_to_the_chunks(parts, make_user):
    sql("CREATE VIEW public.rr_parts_jan AS SELECT id FROM public.rr_parts_2026_01")
    try:
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert "rr_parts_2026_01" not in dropped(run)
        assert relation_exists("rr_parts_2026_01")
        assert count("public.rr_parts_jan") == 0  # its rows went in chunks
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP VIEW IF EXISTS public.rr_parts_jan")


def test_a_foreign_key_to_an_expired_partition_leaves_it_to_the_chunks(parts, make_user):
    sql(
        "ALTER TABLE public.rr_parts_2026_02 ADD UNIQUE (id)",
        "CREATE TABLE public.rr_parts_ref (id bigint REFERENCES public.rr_parts_2026_02 (id)"
        " ON DELETE CASCADE)",
    )
    try:
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert "rr_parts_2026_02" not in dropped(run)
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql("DROP TABLE IF EXISTS public.rr_parts_ref")


def test_a_delete_trigger_sees_every_deleted_row(parts, make_user):
    sql(
        "CREATE TABLE public.rr_parts_archive (id bigint)",
        "CREATE FUNCTION public.rr_parts_archive() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO public.rr_parts_archive VALUES (OLD.id); RETURN OLD; END$$",
        "CREATE TRIGGER rr_parts_archive AFTER DELETE ON public.rr_parts"
        " FOR EACH ROW EXECUTE FUNCTION public.rr_parts_archive()",
    )
    try:
        before = count("public.rr_parts")
        policy = approved_policy(make_user, **parts_spec())
        run, _ = trigger_run(policy, tick=NOW)
        run = drain(run)
        assert run.state == Run.State.DRAINED, run.state_reason
        assert count("public.rr_parts_archive") == before - count("public.rr_parts")
        assert dropped(run) == []
        assert check_run(run, shadow=SHADOW) == []
    finally:
        sql(
            "DROP TABLE IF EXISTS public.rr_parts_archive",
            "DROP TRIGGER IF EXISTS rr_parts_archive ON public.rr_parts",
            "DROP FUNCTION IF EXISTS public.rr_parts_archive()",
        )


def test_an_upper_bound_equal_to_the_cutoff_is_dropped(parts, make_user):
    # 2026-11-30 12:00 less 2916 hours: 2026-08-01 00:00 UTC, July's upper bound
    spec = events_spec(slug="parts", table="rr_parts", retention="2916 hours", keep=[])
    policy = approved_policy(make_user, **spec)
    run, _ = trigger_run(policy, tick=NOW)
    run = drain(run)
    assert run.state == Run.State.DRAINED, run.state_reason
    assert dropped(run) == [f"rr_parts_{m}" for m in EXPIRED]
    assert check_run(run, shadow=SHADOW) == []
