"""One archiving policy over a group of targets writes each target's chunk objects apart:
every ledger numbers its runs and chunks from 1, and no target's object may replace
another's; each database's reconciler pass removes only its own orphans."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from runs.engine import reconciler
from runs.models import AuditRecord, Run
from targets import connections as C
from targets.models import Target
from tests.archive.conftest import create_typed, typed_spec
from tests.factories import approved_policy
from tests.fleet.conftest import run_cli
from tests.runs.conftest import NOW

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_targets_archive_to_one_directory_without_replacing_each_others_objects(
    fleet, make_user, act_as, no_guard, tmp_path
):
    a, b = fleet[0], fleet[1]
    Target.objects.filter(name__in=[a.name, b.name]).update(group="pair")
    directory = tmp_path / "archive"
    directory.mkdir()
    for target in (a, b):
        with C.on(target.name):
            create_typed(720)  # an hour apart: 30 days, the oldest 10 eligible
    policy = approved_policy(
        make_user, **typed_spec(directory, targets=["group:pair"], chunking="key", chunk_size=50)
    )
    act_as(make_user("olga", "oncall"))
    keys = run_cli("trigger", "typed", "--period", NOW.date().isoformat()).split()
    run_cli("drain", "--until-idle", "--workers", "1")

    named: dict[str, int] = {}
    for target, key in zip((a, b), keys, strict=True):
        with C.on(target.name):
            run = Run.objects.get(run_key=key)
            assert run.state == Run.State.DRAINED, run.state_reason
            assert run.pk == 1  # both ledgers number their first run 1
            for record in AuditRecord.objects.filter(run=run):
                for obj in record.archive["objects"]:
                    assert obj["name"].startswith(f"typed/target-{target.name}/run-1/"), obj
                    named[obj["name"]] = obj["rows"]
            deleted = sum(
                AuditRecord.objects.filter(run=run).values_list("rows_deleted", flat=True)
            )
            assert deleted > 0
    # every object either target's audit names is on disk with the rows it was written with
    assert len(named) >= 2
    for name, rows in named.items():
        assert pq.ParquetFile(directory / name).metadata.num_rows == rows
    # each database's pass judges only its own objects: nothing anyone names is removed
    for target in (a, b):
        with C.on(target.name):
            assert reconciler.remove_archive_orphans(policy) == []
    assert reconciler.remove_archive_orphans(policy) == []
    on_disk = {str(p.relative_to(directory)) for p in directory.rglob("*.parquet")}
    assert on_disk == set(named)
