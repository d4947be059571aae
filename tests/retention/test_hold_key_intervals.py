"""A legal hold's key interval is a pair of integers: it applies to a policy whose key is one
integer column. On any other key (text, uuid, several columns) it has no place in the key's
order, so placing one there is refused with one line naming the policy and its key, nothing
is placed, and a version whose key cannot take an active hold's interval is refused — never a
hold silently widened to every row (``retention.holds.key_interval_refusal``)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from core.tokens import create_token
from retention import actions
from retention.models import LegalHold
from retention.spec import PolicySpec, SpecError
from tests.api.conftest import Api
from tests.conftest import token_for_claim
from tests.factories import approved_policy, events_spec

pytestmark = pytest.mark.django_db


def sql(text: str) -> None:
    with connection.cursor() as cur:
        cur.execute(text)


@pytest.fixture
def keyed_tables(db):
    """``rr_text_keys`` (text key), ``rr_uuid_keys`` (uuid key), ``rr_pair_keys`` (two-column
    key) and ``rr_int_keys`` (bigint key), 40 rows each, all 60 days old."""
    shapes = {
        "rr_text_keys": ("id text PRIMARY KEY", "'k' || g"),
        "rr_uuid_keys": ("id uuid PRIMARY KEY", "md5(g::text)::uuid"),
        "rr_pair_keys": ("id int, part int, PRIMARY KEY (id, part)", "g, g % 3"),
        "rr_int_keys": ("id bigint PRIMARY KEY", "g"),
    }
    for name, (key, values) in shapes.items():
        sql(f"DROP TABLE IF EXISTS public.{name}")
        sql(f"CREATE TABLE public.{name} ({key}, occurred_at timestamptz NOT NULL)")
        columns = "id, part" if name == "rr_pair_keys" else "id"
        sql(
            f"INSERT INTO public.{name} ({columns}, occurred_at) SELECT {values},"
            " now() - interval '60 days' FROM generate_series(1, 40) g"
        )
    yield
    for name in shapes:
        sql(f"DROP TABLE IF EXISTS public.{name}")


def policy_on(make_user, slug: str, table: str, key="id"):
    return approved_policy(
        make_user, **events_spec(slug=slug, table=table, key=key, tenant=None, keep=[],
                                 chunk_size=10, chunking="key"),
    )  # fmt: skip


def place(*args) -> tuple[int, str]:
    """``retention hold place`` with ``args``: (exit code, what it printed)."""
    token_for_claim(["--by", "carla"])
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(
            "retention", "hold", "place", "--reason", "case 40", "--by", "carla", *args,
            stdout=out, stderr=err,
        )  # fmt: skip
    except CommandError as exc:
        return 1, err.getvalue() + str(exc)
    return 0, out.getvalue()


@pytest.mark.parametrize(
    "slug,table,key,shown",
    [
        ("texts", "rr_text_keys", "id", "id text"),
        ("uuids", "rr_uuid_keys", "id", "id uuid"),
        ("pairs", "rr_pair_keys", ["id", "part"], "id integer, part integer"),
    ],
)
def test_a_key_interval_on_a_key_that_is_not_one_integer_column_is_refused_with_one_line(
    keyed_tables, make_user, slug, table, key, shown
):
    make_user("carla", "compliance")
    policy_on(make_user, slug, table, key=key)

    code, said = place("--policy", slug, "--key-from", "0", "--key-to", "1")

    assert code == 1
    assert said.strip().splitlines() == [
        f"policy {slug}'s key ({shown}) is not one integer column: a key interval has no place"
        " in its order (it would hold every row); hold the whole policy or a tenant instead"
    ]
    assert not LegalHold.objects.exists()
    # the same hold without the interval holds the policy whole, as it says
    code, said = place("--policy", slug)
    assert code == 0, said
    assert f"{slug}: every row — 40 rows now" in said


def test_the_api_refuses_a_key_interval_on_a_text_key_and_places_nothing(keyed_tables, make_user):
    carla = make_user("carla", "compliance")
    policy_on(make_user, "texts", "rr_text_keys")
    api = Api({"compliance": create_token(carla, name="key intervals")[1]})

    status, answer = api.post(
        "/holds", {"reason": "LIT-40", "policy": "texts", "key_from": 0, "key_to": 1},
        as_="compliance",
    )  # fmt: skip

    assert status in (400, 409, 422), answer
    assert "policy texts's key (id text) is not one integer column" in answer["message"]
    assert not LegalHold.objects.exists()


def test_a_hold_on_all_policies_with_an_interval_is_refused_when_one_key_cannot_take_it(
    keyed_tables, make_user
):
    carla = make_user("carla", "compliance")
    policy_on(make_user, "ints", "rr_int_keys")
    policy_on(make_user, "texts", "rr_text_keys")

    with pytest.raises(actions.ActionError, match="^policy texts's key \\(id text\\)"):
        actions.place_hold(actor=carla, reason="all", key_from=0, key_to=10)
    assert not LegalHold.objects.exists()


def test_an_integer_key_still_takes_its_interval(keyed_tables, make_user):
    make_user("carla", "compliance")
    policy_on(make_user, "ints", "rr_int_keys")

    code, said = place("--policy", "ints", "--key-from", "0", "--key-to", "11")

    assert code == 0, said
    assert "ints: every row, keys [0, 11) — 10 rows now" in said


def test_a_version_whose_key_cannot_take_an_active_holds_interval_is_refused(
    keyed_tables, make_user
):
    carla = make_user("carla", "compliance")
    policy = policy_on(make_user, "ints", "rr_int_keys")
    hold = actions.place_hold(actor=carla, reason="held", policy=policy, key_from=5, key_to=9)
    moved = events_spec(slug="ints", table="rr_text_keys", tenant=None, keep=[],
                        chunk_size=10, chunking="key")  # fmt: skip

    with pytest.raises(SpecError, match=f"active legal hold #{hold.pk} holds keys \\[5, 9\\)"):
        actions.apply_spec(PolicySpec.parse(moved), author=carla)
