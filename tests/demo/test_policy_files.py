"""The demo policies (demo/policies/*.toml): they parse, fit the demo tables, protect
what they promise to protect, and are approved through the product's own actions."""

from __future__ import annotations

from types import ModuleType

import pytest
from django.contrib.auth.models import User
from django.db import connection
from psycopg import sql

from core.models import OperatorAction
from demo.policy_files import (
    PROJECT_DIR,
    apply_demo_policies,
    load_spec,
    load_specs,
    policy_paths,
)
from demo.users import ensure_demo_users
from retention import predicate
from retention.models import Policy, PolicyVersion
from retention.predicate import Fragment, col
from retention.spec import PolicySpec

SLUGS = {"marketplace-events", "delivery-attempts", "orders", "renewal-reminders"}


def test_every_policy_file_parses():
    paths = policy_paths()
    assert {path.stem for path in paths} == SLUGS
    for path in paths:
        spec = load_spec(path)
        assert spec.slug == path.stem
        assert spec.schema == "marketplace"
        assert spec.key == "id" and spec.tenant == "tenant_id"


def test_the_delivery_attempts_policy_archives_under_the_project():
    spec = {s.slug: s for s in load_specs()}["delivery-attempts"]
    assert spec.archive_dir == str(PROJECT_DIR / ".archive" / "delivery-attempts")
    assert spec.restore_days == 30
    assert (PROJECT_DIR / ".archive" / "delivery-attempts").is_dir()


def test_the_events_policy_is_the_documented_one():
    spec = {s.slug: s for s in load_specs()}["marketplace-events"]
    assert (spec.table, spec.timestamp, spec.retention) == (
        "marketplace_events",
        "occurred_at",
        "90 days",
    )
    assert (spec.schedule, spec.timezone, spec.chunk_size) == ("*/10 * * * *", "UTC", 5000)
    assert (spec.policy_workers, spec.tenant_workers) == (2, 1)


def test_each_policy_names_columns_of_the_demo_tables(marketplace):
    for spec in load_specs():
        with connection.cursor() as cur:
            cur.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s",
                [spec.schema, spec.table],
            )
            columns = {row[0] for row in cur.fetchall()}
        named = {spec.key, spec.timestamp, spec.tenant, *(rule.column for rule in spec.keep)}
        assert named <= columns, (spec.slug, named - columns)


# (policy, SQL naming the rows it promises never to delete)
PROTECTED = {
    "renewal-reminders": "t.state = 'pending'",
    "delivery-attempts": "t.outcome = 'pending'",
    "orders": "t.status IN ('disputed', 'chargeback') OR t.refund_state = 'open'",
}


@pytest.mark.parametrize("slug", sorted(SLUGS))
def test_each_policy_finds_old_rows_and_spares_the_protected_ones(marketplace, slug):
    spec = {s.slug: s for s in load_specs()}[slug]
    cutoff = spec.cutoff_for(marketplace.reference_at)
    eligible = predicate.eligible(spec, policy_id=0, cutoff=cutoff, include_holds=False)
    total = _count(spec, Fragment(sql.SQL("TRUE"), []))
    assert 0.2 * total < _count(spec, eligible) < 0.8 * total
    if slug in PROTECTED:
        protected = Fragment(sql.SQL("(" + PROTECTED[slug] + ")"), [])
        old = Fragment(sql.SQL("{} < %s").format(col(spec.timestamp)), [cutoff])
        assert _count(spec, Fragment.join([old, protected], " AND ")) > 0
        assert _count(spec, Fragment.join([eligible, protected], " AND ")) == 0


def test_without_the_approval_actions_nothing_is_applied(db):
    ensure_demo_users()
    alice, carol = User.objects.get(username="alice"), User.objects.get(username="carol")
    outcomes = apply_demo_policies(
        author=alice, approver=carol, actions=ModuleType("retention.actions")
    )
    assert {o.slug: o.status for o in outcomes} == dict.fromkeys(SLUGS, "unavailable")
    assert not Policy.objects.exists()


def test_the_demo_policies_are_written_by_alice_and_approved_by_carol(marketplace):
    ensure_demo_users()
    alice, carol = User.objects.get(username="alice"), User.objects.get(username="carol")

    outcomes = apply_demo_policies(author=alice, approver=carol)
    assert {o.slug: o.status for o in outcomes} == dict.fromkeys(SLUGS, "approved"), outcomes
    for spec in load_specs():
        version = Policy.objects.get(slug=spec.slug).approved_version
        assert version.content_hash == spec.content_hash()
        assert (version.author, version.decided_by, version.decision_reason) == (
            alice,
            carol,
            "demo",
        )
    versions, actions_logged = PolicyVersion.objects.count(), OperatorAction.objects.count()

    again = apply_demo_policies(author=alice, approver=carol)
    assert {o.slug: o.status for o in again} == dict.fromkeys(SLUGS, "already approved")
    assert PolicyVersion.objects.count() == versions
    assert OperatorAction.objects.count() == actions_logged


def _count(spec: PolicySpec, where: Fragment) -> int:
    query = predicate.count_where(spec, where)
    with connection.cursor() as cur:
        cur.execute(query.sql, query.params)
        return cur.fetchone()[0]
