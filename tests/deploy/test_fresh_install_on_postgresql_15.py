"""The fresh installation of tests/deploy/test_fresh_install.py, the same way, on the
machine's PostgreSQL 15. A file of its own, so test processes that take whole files
(``--dist loadfile``) deploy on both servers side by side."""

from __future__ import annotations

import psycopg
import pytest

from tests.deploy.install import deploy_and_operate
from tests.deploy.test_fresh_install import assert_deployed

pytestmark = [pytest.mark.processes]


def test_the_same_deployment_on_the_machines_postgresql_15(tmp_path):
    admin = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
    try:
        with psycopg.connect(**admin, dbname="postgres", connect_timeout=3) as conn:
            version = conn.info.server_version
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 ({exc})")
    assert version // 10000 == 15, version
    assert_deployed(deploy_and_operate(admin, tmp_path, every_command=False))
