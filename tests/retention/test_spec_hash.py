"""The content hash of a policy: equal policies hash equal whatever their number formatting,
and versions stored before numbers were normalized still verify."""

from __future__ import annotations

import hashlib
import json

from retention import actions
from retention.models import Policy, PolicyVersion
from retention.spec import load_toml

from .conftest import policy_toml


def test_equal_policies_hash_equal_whatever_their_number_formatting():
    as_default = load_toml(policy_toml())
    as_int = load_toml(policy_toml(blast_radius="3", tables="[guard]\nprobe_p95_ms = 25\n"))
    as_float = load_toml(policy_toml(blast_radius="3.0", tables="[guard]\nprobe_p95_ms = 25.0\n"))

    assert as_int.content_hash() == as_float.content_hash() == as_default.content_hash()
    assert as_int.guard["probe_p95_ms"] == 25.0 and isinstance(as_int.guard["probe_p95_ms"], float)
    assert load_toml(as_int.to_toml()).content_hash() == as_int.content_hash()
    # an integer field stays an integer: `lock_waits = 5.0` is the default 5
    as_count = load_toml(policy_toml(tables="[guard]\nlock_waits = 5.0\n"))
    assert as_count.content_hash() == as_default.content_hash()
    # a different value is a different policy
    other = load_toml(policy_toml(tables="[guard]\nprobe_p95_ms = 26\n"))
    assert other.content_hash() != as_int.content_hash()


def _hash(document: dict) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_a_version_stored_with_an_integer_guard_value_still_verifies_and_approves(
    events_table, alice, bob
):
    # a draft written before numbers were normalized: its stored document says 25, not 25.0
    document = load_toml(policy_toml()).to_json()
    document["guard"] = dict(document["guard"], probe_p95_ms=25)
    document["blast_radius"] = 3
    policy = Policy.objects.create(slug="events", name="events", schedule="0 3 * * *")
    old_hash = _hash(document)
    version = PolicyVersion.objects.create(
        policy=policy, number=1, state="draft", spec=document, content_hash=old_hash, author=alice
    )

    assert version.parsed.content_hash() == old_hash
    actions.submit_version(version, actor=alice, reason="ready for review")
    actions.approve_version(version, actor=bob, reason="verified against its stored hash")

    version.refresh_from_db()
    assert (version.state, version.approved_hash) == ("approved", old_hash)
