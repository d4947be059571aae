"""A chunk's DELETE on a table that references itself ``ON DELETE CASCADE`` (a posts table whose
reposts reference their original): the plan and cost of the cascade guard
(``retention.cascades``), with and without an index on the referencing column, and without
the guard. Prints a Markdown table and each plan.

    .venv/bin/python bench/cascades.py [--rows 200000] [--chunk 5000]

Database ``retention_bench_cascades`` on the embedded server (or ``BENCH_SERVER_URL``'s),
migrated on first use. ``bench.posts``: ``--rows`` rows, half originals over 40 days (bigint
``id`` in time order, tenant ``id % 10``), half reposts of an original (``repost_of``), a
quarter of them two days old (younger than the cutoff) and a third of tenant 9 (held). The
policy deletes rows older than 20 days, a legal hold on tenant 9. Each variant runs the first
chunk's DELETE (``--chunk`` keys of the originals) under ``EXPLAIN (ANALYZE, BUFFERS)`` in a
transaction that is rolled back.

- ``guard, index``: the product's DELETE, ``(repost_of)`` indexed;
- ``guard, no index``: the same without that index (validation warns about it);
- ``no guard, index``: the DELETE as it was before the guard (it deletes held and young
  reposts through the cascade).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, server_url, with_database  # noqa: E402

DB = "retention_bench_cascades"
TICK = datetime(2026, 11, 30, 12, tzinfo=UTC)


def prepare() -> str:
    server = server_url()
    url = with_database(server, DB)
    with psycopg.connect(server, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            admin.execute(f'CREATE DATABASE "{DB}"')
    env = dict(os.environ, DATABASE_URL=url, RETENTION_DEMO="1")
    for cmd in (["migrate", "--no-input", "-v", "0"], ["createcachetable"]):
        subprocess.run([sys.executable, "manage.py", *cmd], cwd=ROOT, env=env, check=True)
    return url


def build(conn, rows: int) -> None:
    half = rows // 2
    conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
    conn.execute("DROP TABLE IF EXISTS bench.posts")
    conn.execute(
        "CREATE TABLE bench.posts (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
        " created_at timestamptz NOT NULL, repost_of bigint"
        " REFERENCES bench.posts (id) ON DELETE CASCADE)"
    )
    conn.execute(
        "INSERT INTO bench.posts SELECT g, g %% 10,"
        " %s::timestamptz - make_interval(secs => 40 * 86400.0 * (1 - g::float8 / %s)), NULL"
        " FROM generate_series(1, %s) AS g",
        [TICK, half, half],
    )
    conn.execute(
        "INSERT INTO bench.posts SELECT %s + g, CASE WHEN g %% 3 = 0 THEN 9 ELSE 1 END,"
        " CASE WHEN g %% 4 = 0 THEN %s::timestamptz - interval '2 days'"
        "  ELSE %s::timestamptz - interval '30 days' END, g"
        " FROM generate_series(1, %s) AS g",
        [half, TICK, TICK, rows - half],
    )
    conn.execute("CREATE INDEX posts_repost_of ON bench.posts (repost_of)")
    conn.execute("CREATE INDEX ON bench.posts (tenant_id, id)")
    conn.execute("VACUUM ANALYZE bench.posts")


def policy():
    from django.contrib.auth.models import Group, User

    from retention import actions
    from retention.models import Policy, PolicyVersion
    from retention.spec import PolicySpec

    def user(name):
        u, _ = User.objects.get_or_create(username=name)
        u.groups.add(Group.objects.get_or_create(name="compliance")[0])
        return u

    slug = f"posts-{int(time.time())}"
    spec = PolicySpec.parse(
        {
            "slug": slug, "table": "bench.posts", "key": "id", "timestamp": "created_at",
            "tenant": "tenant_id", "retention": "20 days", "schedule": "0 3 * * *",
            "timezone": "UTC", "chunking": "key", "cascade_ack": ["bench.posts"],
        }
    )  # fmt: skip
    author, approver = user("bench-author"), user("bench-approver")
    version = actions.apply_spec(spec, author=author)
    if version.state == PolicyVersion.State.DRAFT:
        version = actions.submit_version(version, actor=author, reason="ready for review")
    actions.approve_version(version, actor=approver, reason="benchmark")
    found = Policy.objects.get(slug=slug)
    actions.place_hold(actor=approver, reason="benchmark", policy=found, tenant="9")
    return found


def explain(found, chunk: int, *, guarded: bool) -> tuple[list[str], int]:
    from django.db import connection, transaction

    from retention import cascades
    from retention import predicate as P

    spec = found.approved_version.parsed
    cutoff = spec.cutoff_for(TICK)
    _graph, guard = cascades.for_run(spec, policy_id=found.pk, cutoff=cutoff, tick=TICK)
    delete = P.delete_chunk(
        spec, policy_id=found.pk, cutoff=cutoff, tenant=None, key_from=1, key_to=1 + chunk,
        cascade=guard if guarded else None,
    )  # fmt: skip
    with connection.cursor() as cur:
        try:
            with transaction.atomic():
                cur.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + delete.sql.as_string(cur.connection),
                    delete.params,
                )
                plan = [r[0] for r in cur.fetchall()]
                cur.execute("SELECT n_tup_del FROM pg_stat_xact_user_tables WHERE relid ="
                            " 'bench.posts'::regclass")  # fmt: skip
                removed = cur.fetchone()[0]
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
    return plan, removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=5000)
    parser.add_argument(
        "--only", default="guard-index,guard-no-index,no-guard-index",
        help="variants, comma-separated (guard-no-index takes minutes at 200k rows)",
    )  # fmt: skip
    args = parser.parse_args()
    url = prepare()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("RETENTION_DEMO", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    conn = psycopg.connect(url, autocommit=True)
    build(conn, args.rows)
    found = policy()
    version = conn.execute("SHOW server_version").fetchone()[0]
    results, plans = [], {}
    variants = [
        ("guard, index", True, True),
        ("guard, no index", True, False),
        ("no guard, index", False, True),
    ]
    for name, guarded, index in variants:
        if name.replace(", ", "-").replace(" ", "-") not in args.only.split(","):
            continue
        if not index:
            conn.execute("DROP INDEX IF EXISTS bench.posts_repost_of")
        else:
            conn.execute("CREATE INDEX IF NOT EXISTS posts_repost_of ON bench.posts (repost_of)")
        conn.execute("ANALYZE bench.posts")
        plan, removed = explain(found, args.chunk, guarded=guarded)
        plans[name] = plan
        text = "\n".join(plan)
        ms = next(line for line in plan if line.startswith("Execution Time")).split(":")[1]
        top = next(line for line in plan if "Buffers:" in line).strip()
        results.append(
            (name, removed, ms.strip(), top.removeprefix("Buffers: "), "posts_repost_of" in text)
        )
    print(
        f"\n## One chunk's DELETE ({args.chunk} keys) on {args.rows:,} posts, PostgreSQL {version}\n"
    )
    print(
        "| variant | rows removed (cascades included) | execution | buffers | repost_of index used |"
    )
    print("|---|---:|---:|---|---|")
    for name, removed, ms, buffers, used in results:
        print(f"| {name} | {removed:,} | {ms} | {buffers} | {'yes' if used else 'no'} |")
    for name, plan in plans.items():
        print(f"\n### {name}\n\n```\n" + "\n".join(plan) + "\n```")


if __name__ == "__main__":
    main()
