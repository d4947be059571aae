"""The JSON database cache (core.cache) behaves as a Django cache and stores no pickles."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from django.core.cache import cache, caches
from django.db import connection

pytestmark = pytest.mark.django_db


def stored(key: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT value FROM core_cache WHERE cache_key = %s", [cache.make_key(key)])
        return cur.fetchone()[0]


def test_values_round_trip_as_json_with_datetimes():
    value = {"at": datetime(2026, 12, 1, 9, 30, tzinfo=UTC), "day": date(2026, 12, 1),
             "n": [1, 2.5, None, True, "x"]}  # fmt: skip
    cache.set("k", value, 60)
    assert cache.get("k") == value
    assert stored("k").startswith('{"at":{"$datetime":"2026-12-01T09:30:00+00:00"}')


def test_set_add_touch_delete_and_expiry():
    assert cache.add("a", 1, 60) is True
    assert cache.add("a", 2, 60) is False
    cache.set("a", 3, 60)
    assert cache.get("a") == 3
    assert cache.touch("a", None) is True
    cache.set("gone", 1, -1)  # already expired: reads as a miss, and add may take it
    assert cache.get("gone", "miss") == "miss"
    assert cache.add("gone", 2, 60) is True
    assert cache.get_many(["a", "gone", "none"]) == {"a": 3, "gone": 2}
    assert cache.delete("a") is True
    assert cache.get("a") is None
    cache.set("forever", "x", None)
    assert cache.get("forever") == "x"
    cache.clear()
    assert cache.get("forever") is None


def test_a_value_that_is_not_json_is_refused_on_write_and_a_miss_on_read():
    with pytest.raises(TypeError, match="JSON values only, not object"):
        cache.set("o", object())
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO core_cache VALUES (%s, 'gASVIAAAAAAAAAB9lC4=', now() + interval '1 h')",
            [cache.make_key("pickled")],
        )
    assert cache.get("pickled", "miss") == "miss"


def test_the_cluster_cache_is_a_separate_table():
    caches["cluster"].set("k", "cluster")
    cache.set("k", "web")
    assert (caches["cluster"].get("k"), cache.get("k")) == ("cluster", "web")


def test_set_many_writes_every_key_in_one_statement(monkeypatch):
    from django.test.utils import CaptureQueriesContext

    from core.cache import JSONDatabaseCache

    # the cull of expired entries that every hundredth write of the process adds is not due
    # here, whatever this process wrote before
    monkeypatch.setattr(JSONDatabaseCache, "_writes", 0)
    cache.set("b", "old", 60)
    with CaptureQueriesContext(connection) as captured:
        assert cache.set_many({"b": {"n": 2}, "c": [1, 2], "d": "x"}, None) == []
    assert len(captured) == 1
    assert cache.get_many(["b", "c", "d"]) == {"b": {"n": 2}, "c": [1, 2], "d": "x"}
