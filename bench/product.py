"""The product as a contender, in child processes pointed at the bench database by
``DATABASE_URL`` (``python -m bench.product setup|drain SPEC_JSON``).

``setup``: migrate-free preparation through the real actions — two users in the
compliance group, ``apply_spec`` → ``submit_version`` (validation and dry-run preview)
→ ``approve_version`` by the second person, then ``trigger_run`` for the dataset's tick.
Prints the run key, how long approval and trigger took and the chunk geometry the run
chose, or ``{"refused": …}`` with the product's error when it refuses the policy or the run.
Nothing is planned here: the workers plan every window, the first included, inside the timed
part (as the key-range loop's ``min``/``max`` read is inside its own).

``explain``: the same approval, then ``manage.py retention explain SLUG`` (the plans of every
engine statement on the table, ``EXPLAIN (ANALYZE, BUFFERS)``, the DELETE rolled back); prints
its output.

``drain``: a worker. After ``django.setup()`` it prints ``ready`` and waits for ``go`` on
stdin, then runs exactly ``manage.py retention drain RUN_KEY --until-idle`` in-process
(``call_command``), so Django's start-up is not timed but everything the worker does is.
With ``BENCH_PROFILE=DIR`` in the bench's environment, each drain writes its cProfile to
``DIR/drain-RUN_KEY-PID.prof`` (the key's ``/`` as ``_``) (``python -m pstats`` reads it).
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from psycopg import sql

from bench.common import ROOT, SCHEMA, cpu_mark, cpu_spent, peak_rss_kb


def _django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def _user(username: str):
    from django.contrib.auth.models import Group, User

    from core.roles import COMPLIANCE

    user, _ = User.objects.get_or_create(username=username)
    user.groups.add(Group.objects.get_or_create(name=COMPLIANCE)[0])
    return user


def setup(spec: dict) -> dict:
    """Approve and trigger; a policy or run the product refuses (a key type it does not
    support yet, say) comes back as ``{"refused": "<the product's error>"}``, not a crash."""
    _django()
    try:
        return _setup(spec)
    except Exception as exc:  # noqa: BLE001 - any refusal is a result of the benchmark
        message = " ".join(str(exc).split()) or type(exc).__name__
        return {"refused": message, "rss_kb": peak_rss_kb()}


def _setup(spec: dict) -> dict:
    from runs.actions import trigger_run

    t0 = time.monotonic()
    policy = _approve(spec)
    t1 = time.monotonic()
    run, _ = trigger_run(
        policy, tick=datetime.fromisoformat(spec["tick"]), source="manual", actor="scheduler"
    )
    t2 = time.monotonic()
    if run.cutoff != datetime.fromisoformat(spec["cutoff"]):
        raise RuntimeError(f"run cutoff {run.cutoff} differs from the dataset's {spec['cutoff']}")
    if run.state != run.State.ACTIVE:
        raise RuntimeError(f"run {run.run_key} is {run.state}: {run.state_reason}")
    return {
        "run_id": run.id,
        "run_key": run.run_key,
        "expected_rows": run.expected_rows,
        "approve_s": t1 - t0,
        "trigger_s": t2 - t1,
        "chunking": run.chunking,
        "chunking_reason": run.chunking_reason,
        "rss_kb": peak_rss_kb(),
    }


def _approve(spec: dict):
    """The policy of ``spec`` applied, submitted and approved by a second person."""
    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec

    fields = {
        "slug": spec["slug"],
        "name": f"bench {spec['slug']}",
        "table": f"bench.{spec['table']}",
        "key": spec.get("key", "id"),
        "timestamp": "occurred_at",
        "retention": spec["retention"],
        "schedule": "0 0 * * *",
        "timezone": "UTC",
        "chunk_size": spec["chunk_size"],
        "target_chunk_ms": spec["target_chunk_ms"],
        "blast_radius": 1000.0,
        "limits": {"policy_workers": spec["workers"], "tenant_workers": spec["workers"]},
    }
    if spec.get("tenant"):
        fields["tenant"] = "tenant_id"
        fields["limits"]["tenant_workers"] = 1
    if spec.get("cascade_ack"):
        fields["cascade_ack"] = spec["cascade_ack"]
    if spec.get("archive_dir"):  # archive, then delete (docs/policies.md)
        Path(spec["archive_dir"]).mkdir(parents=True, exist_ok=True)
        fields["archive"] = {"to": f"file://{spec['archive_dir']}"}
    if spec.get("archive_table"):  # archive to a table of the control database (docs/policies.md)
        from django.db import connection  # Django is set up by now (``_django``)

        with connection.cursor() as cur:
            for statement in _archive_table_ddl(spec["table"]):
                cur.execute(statement)
        fields["archive"] = {"to": f"target:default/{ARCHIVE_SCHEMA}.{spec['table']}"}
    author, approver = _user("bench-author"), _user("bench-approver")
    version = actions.apply_spec(PolicySpec.parse(fields), author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    if version.state == PolicyVersion.State.SUBMITTED:
        actions.approve_version(version, actor=approver, reason="benchmark")
    return Policy.objects.get(slug=spec["slug"])


ARCHIVE_SCHEMA = "bench_archive"


def _archive_table_ddl(table: str) -> list[str]:
    """An empty archive table of ``bench.<table>``'s columns, types and unique indexes."""
    names = dict(
        s=sql.Identifier(ARCHIVE_SCHEMA), t=sql.Identifier(table), b=sql.Identifier(SCHEMA)
    )
    return [
        sql.SQL(text).format(**names).as_string(None)
        for text in (
            "CREATE SCHEMA IF NOT EXISTS {s}",
            "DROP TABLE IF EXISTS {s}.{t}",
            "CREATE TABLE {s}.{t} (LIKE {b}.{t} INCLUDING INDEXES)",
        )
    ]


def drop_archive_table(conn, table: str) -> None:
    conn.execute(
        sql.SQL("DROP TABLE IF EXISTS {}.{}").format(
            sql.Identifier(ARCHIVE_SCHEMA), sql.Identifier(table)
        )
    )


def explain(spec: dict) -> dict:
    """``retention explain`` of the policy of ``spec`` on its (untouched) table."""
    _django()
    from django.core.management import call_command

    try:
        _approve(spec)
        out = io.StringIO()
        call_command("retention", "explain", spec["slug"], stdout=out)
    except Exception as exc:  # noqa: BLE001 - a refusal is a result of the benchmark
        return {"refused": " ".join(str(exc).split()) or type(exc).__name__}
    return {"plans": out.getvalue()}


class TimeCap(Exception):
    """The contender's time cap ran out (the chunk in flight rolls back)."""


def _raise_cap(signum, frame):
    raise TimeCap


def drain(spec: dict) -> dict:
    _django()
    from django.core.management import call_command, load_command_class
    from django.db import connection

    connection.ensure_connection()
    load_command_class("runs", "retention")  # imported: start-up, as Django's own, is not timed
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = cpu_mark([connection.connection.info.backend_pid])
    started = time.time()
    out = io.StringIO()
    capped = False
    if spec.get("time_cap_s"):
        signal.signal(signal.SIGALRM, _raise_cap)
        signal.setitimer(signal.ITIMER_REAL, spec["time_cap_s"])
    profile = os.environ.get("BENCH_PROFILE")  # a folder: this drain's cProfile goes there
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler:
            profiler.enable()
        call_command("retention", "drain", spec["run_key"], "--until-idle", stdout=out)
    except TimeCap:
        capped = True
    finally:
        if profiler:
            profiler.disable()
            Path(profile).mkdir(parents=True, exist_ok=True)
            profiler.dump_stats(
                Path(profile) / f"drain-{spec['run_key'].replace('/', '_')}-{os.getpid()}.prof"
            )
    signal.setitimer(signal.ITIMER_REAL, 0)
    ended = time.time()
    return {
        "started": started,
        "ended": ended,
        # this process (its threads too) and its main connection's backend, while it drained
        "cpu": cpu_spent(cpu),
        "pid": os.getpid(),
        "summary": out.getvalue().strip() or "stopped at the time cap",
        "capped": capped,
        "rss_kb": peak_rss_kb(),
    }


if __name__ == "__main__":
    mode, arg = sys.argv[1], json.loads(sys.argv[2])
    result = {"setup": setup, "drain": drain, "explain": explain}[mode](arg)
    print(json.dumps(result, default=str), flush=True)
