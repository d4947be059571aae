"""A hold that protects nothing is said so when it is placed: placing a hold (page and CLI)
shows how many rows it covers now in each policy, warns when that is none, and offers the
tenant values that match it ignoring case (a hold on ``alice.smith`` while the rows say
``Alice.Smith``); the holds page shows each hold's coverage now. A tenant of several columns
is held by naming each part."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from core.models import OperatorAction
from retention.models import LegalHold
from runs.actions import trigger_run
from runs.engine import worker
from runs.models import Run
from tests.conftest import token_for_claim
from tests.factories import approved_policy, events_spec

from .test_hold_tenant_types import NOW, _sql


@pytest.fixture
def officer(make_user):
    return make_user("hilda", "compliance")


@pytest.fixture
def accounts(db, make_user):
    """``public.rr_accounts``: 1,200 old rows of tenant 'Alice.Smith' and 300 of 'bob'
    (``character varying(64)``, case-sensitive), index (tenant, id)."""
    _sql("DROP TABLE IF EXISTS public.rr_accounts")
    _sql(
        "CREATE TABLE public.rr_accounts (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL,"
        " tenant character varying(64) NOT NULL)"
    )
    _sql(
        "INSERT INTO public.rr_accounts SELECT g, %s::timestamptz - interval '40 days',"
        " CASE WHEN g <= 1200 THEN 'Alice.Smith' ELSE 'bob' END FROM generate_series(1, 1500) g",
        [NOW],
    )
    _sql("CREATE INDEX ON public.rr_accounts (tenant, id)")
    return approved_policy(
        make_user,
        **events_spec(slug="accounts", table="rr_accounts", tenant="tenant", keep=[]),
    )


def _cli(*args) -> str:
    token_for_claim(args)
    out = io.StringIO()
    call_command("retention", "hold", *args, stdout=out)
    return out.getvalue()


def test_a_hold_that_matches_no_row_is_placed_with_a_warning_and_the_values_that_match_it(
    accounts, officer
):
    placed = _cli(
        "place", "--reason", "case 9", "--by", "hilda", "--policy", "accounts",
        "--tenant", "alice.smith",
    )  # fmt: skip
    hold = LegalHold.objects.get()
    assert placed.splitlines() == [
        f"hold #{hold.pk} placed: policy accounts, tenant alice.smith",
        "  accounts: tenant alice.smith (character varying(64)) — 0 rows now",
        "warning: it protects no row of accounts now; tenant values that match it ignoring "
        "case: Alice.Smith",
    ]
    logged = OperatorAction.objects.get(action="hold.place").details["coverage"]
    assert logged == [
        {
            "policy": "accounts",
            "covers": "tenant alice.smith (character varying(64))",
            "rows": 0,
            "capped": False,
            "similar": ["Alice.Smith"],
        }
    ]
    # the warning was right: the run deletes the rows the hold was meant for
    run, _ = trigger_run(accounts, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    assert Run.objects.get(pk=run.pk).state == Run.State.DRAINED
    assert _sql("SELECT count(*) FROM public.rr_accounts") == [(0,)]


def test_a_hold_that_covers_rows_says_how_many(accounts, officer):
    placed = _cli(
        "place", "--reason", "case 9", "--by", "hilda", "--policy", "accounts",
        "--tenant", "Alice.Smith",
    )  # fmt: skip
    assert "  accounts: tenant Alice.Smith (character varying(64)) — 1,200 rows now" in placed
    assert "warning" not in placed
    listed = _cli("list")
    assert "  accounts: tenant Alice.Smith (character varying(64)) — 1,200 rows now" in listed
    whole = _cli("place", "--reason", "case 10", "--by", "hilda", "--policy", "accounts")
    assert "  accounts: every tenant — 1,500 rows now" in whole


def test_placing_on_the_page_warns_and_the_holds_page_shows_each_holds_coverage_now(
    accounts, officer, client
):
    client.force_login(officer)
    page = client.post(
        reverse("retention:hold_place"),
        {"policy": "accounts", "tenant": "alice.smith", "reason": "case 9"},
        follow=True,
    ).content.decode()
    hold = LegalHold.objects.get()
    assert (
        f"hold #{hold.pk} placed — but it protects no row of accounts now; tenant values that "
        "match it ignoring case: Alice.Smith"
    ) in page
    assert 'class="warning"' in page or "messages warning" in page or "warning" in page
    assert (
        '<div data-covers="accounts">accounts: tenant alice.smith (character varying(64))'
        ' — <span class="warning" data-rows="0">0 rows now</span></div>'
    ) in page
    client.post(
        reverse("retention:hold_place"),
        {"policy": "accounts", "tenant": "bob", "reason": "case 11"},
        follow=True,
    )
    listing = client.get(reverse("retention:holds")).content.decode()
    assert '<span data-rows="300">300 rows now</span>' in listing


@pytest.fixture
def entities(db, make_user):
    """``public.rr_entities``: an audit log owned by (entity_type, entity_id): 40-day-old rows
    of group 42, project 42 and user 42 (100 each) and project 7 (50)."""
    _sql("DROP TABLE IF EXISTS public.rr_entities")
    _sql(
        "CREATE TABLE public.rr_entities (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL,"
        " entity_type text NOT NULL, entity_id bigint NOT NULL)"
    )
    for n, (kind, entity, rows) in enumerate(
        [("group", 42, 100), ("project", 42, 100), ("user", 42, 100), ("project", 7, 50)]
    ):
        _sql(
            "INSERT INTO public.rr_entities SELECT g, %s::timestamptz - interval '40 days', %s, %s"
            " FROM generate_series(%s, %s) g",
            [NOW, kind, entity, n * 1000 + 1, n * 1000 + rows],
        )
    _sql("CREATE INDEX ON public.rr_entities (entity_type, entity_id, id)")
    return approved_policy(
        make_user,
        **events_spec(
            slug="entities", table="rr_entities", tenant=["entity_type", "entity_id"], keep=[],
        ),
    )  # fmt: skip


def test_a_hold_on_a_tenant_of_two_columns_names_each_part_and_holds_only_that_entity(
    entities, officer
):
    placed = _cli(
        "place", "--reason", "case 42", "--by", "hilda", "--policy", "entities",
        "--tenant", "project", "--tenant", "042",
    )  # fmt: skip
    hold = LegalHold.objects.get()
    assert json.loads(hold.tenant) == ["project", "42"]  # each part in its column's type
    assert (
        "  entities: tenant (entity_type = project, entity_id = 42) (text, bigint) — 100 rows now"
    ) in placed
    with pytest.raises(CommandError) as refused:
        _cli(
            "place", "--reason", "case 42", "--by", "hilda", "--policy", "entities",
            "--tenant", "42",
        )  # fmt: skip
    assert str(refused.value) == (
        "policy entities's tenant (entity_type, entity_id) has 2 columns: name each part "
        "(retention hold place --tenant ENTITY_TYPE --tenant ENTITY_ID, in that order)"
    )
    assert LegalHold.objects.count() == 1

    run, _ = trigger_run(entities, tick=NOW)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    # project 42 is held; group 42 and user 42 are not (a hold on entity 42 alone held them all)
    assert _sql(
        "SELECT entity_type, entity_id, count(*) FROM public.rr_entities GROUP BY 1, 2"
    ) == [("project", 42, 100)]
