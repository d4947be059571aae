"""Fixtures for archiving: a table of every archived column type, and policies that archive."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
from django.db import connection

from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW

TYPED_COLUMNS = (
    "id bigint PRIMARY KEY, tenant_id int NOT NULL, occurred_at timestamptz NOT NULL,"
    " status text, amount numeric(14,4), exact numeric, small smallint, ratio float8,"
    " flag boolean, day date, local_at timestamp, doc jsonb, js json, raw bytea,"
    " tags text[], nums integer[], prices numeric(8,2)[], ref uuid, span interval"
)


def create_typed(rows: int = 600, name: str = "rr_typed") -> None:
    """``public.<name>`` holding every column type the archive keeps, rows a day apart over
    ``rows / 24`` days before NOW; every 17th row 'disputed', every 7th with NULLs."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}")
        cur.execute(f"CREATE TABLE public.{name} ({TYPED_COLUMNS})")
        cur.execute(
            f"""INSERT INTO public.{name}
            SELECT g, 1 + g %% 3, %s::timestamptz - make_interval(hours => %s - g),
              CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed ' || chr(228) || g END,
              CASE WHEN g %% 7 = 0 THEN NULL ELSE (g * 1234.5678)::numeric(14,4) END,
              CASE WHEN g %% 7 = 0 THEN NULL ELSE ('123456789012345678901234567890.' || g)::numeric END,
              (g %% 30000)::smallint, g / 3.0::float8, g %% 2 = 0,
              DATE '2020-02-29' + g, TIMESTAMP '2026-03-29 01:30:00.123456' + make_interval(mins => g),
              jsonb_build_object('g', g, 'nested', jsonb_build_array(1, 'two', NULL, 3.5)),
              CASE WHEN g %% 7 = 0 THEN NULL ELSE json_build_object('k', g, 'sp', '  x ') END,
              CASE WHEN g %% 7 = 0 THEN NULL ELSE decode(md5(g::text) || '00ff', 'hex') END,
              CASE WHEN g %% 7 = 0 THEN NULL ELSE ARRAY['a' || g, NULL, 'c,"d"'] END,
              ARRAY[g, -g, NULL]::int[], ARRAY[g + 0.25, 1.5]::numeric(8,2)[],
              md5(g::text)::uuid, make_interval(days => g, secs => 1.5)
            FROM generate_series(1, %s) AS g""",
            [NOW, rows, rows],
        )
        cur.execute(f"CREATE INDEX ON public.{name} (tenant_id, id)")
        cur.execute(f"ANALYZE public.{name}")


def typed_spec(
    directory, slug: str = "typed", table: str = "rr_typed", keep_years=None, **overrides
) -> dict:
    """Rows older than 20 days go, archived under ``directory`` first; 'disputed' kept."""
    archive = {"to": f"file://{directory}", "restore_days": 30}
    if keep_years is not None:
        archive["keep_years"] = keep_years
    return events_spec(slug=slug, table=table, archive=archive, **overrides)


@pytest.fixture
def archive_dir(tmp_path):
    directory = tmp_path / "archive"
    directory.mkdir()
    return directory


@pytest.fixture
def typed_policy(db, make_user, archive_dir):
    create_typed()
    return approved_policy(make_user, **typed_spec(archive_dir))


@contextlib.contextmanager
def read_only(directory):
    """``directory`` read-only for this process too: a read-only file system mounted over it
    (root ignores permission bits), or its write permission taken away (anyone else)."""
    if os.geteuid() == 0:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(directory)], check=True
        )
        try:
            yield
        finally:
            subprocess.run(["umount", str(directory)], check=True)
    else:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)


@contextlib.contextmanager
def full(directory):
    """``directory`` on a file system with no byte free: a 64 kB tmpfs mounted over it and
    filled up (root only: mounting needs it)."""
    if os.geteuid() != 0:
        pytest.skip("a full file system is mounted by root only (the read-only test runs for all)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory)], check=True)
    try:
        fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            with contextlib.suppress(OSError):  # until ENOSPC
                while os.write(fd, b"\0" * 512):
                    pass
        finally:
            os.close(fd)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)
