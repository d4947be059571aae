"""A legal hold's tenant is compared in the tenant column's own type: what the type's ``=``
says is held is held, however the hold's value was written (case, leading zeros, spaces, an
upper-case uuid). A value the type cannot hold is refused when the hold is placed; a hold on
all policies says which policies it covers and how; a policy without a tenant column is held
entirely by a tenant-scoped hold on all policies."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import NotSupportedError, connection, transaction
from django.urls import reverse

from core.models import OperatorAction
from retention import actions
from retention.actions import ActionError
from retention.models import LegalHold
from retention.schedule_math import latest_tick
from retention.spec import PolicySpec, SpecError
from runs.actions import trigger_run
from runs.engine import worker
from runs.engine.explain import explain
from runs.models import Run
from tests.conftest import token_for_claim
from tests.factories import approved_policy, events_spec

pytestmark = pytest.mark.usefixtures("no_guard")

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UUID_A = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
UUID_B = "b1eebc99-9c0b-4ef8-bb6d-6bb9bd380a22"


def _sql(text: str, params=None) -> list:
    with connection.cursor() as cur:
        cur.execute(text, params or [])
        return cur.fetchall() if cur.description else []


def _table(name: str, tenant_type: str | None, tenants: list[str], *, rows_each: int = 30):
    """``public.<name>``: ``rows_each`` old rows (40 days) per tenant value, index (tenant, id)."""
    _sql(f"DROP TABLE IF EXISTS public.{name}")
    tenant_col = f", tenant {tenant_type} NOT NULL" if tenant_type else ""
    _sql(
        f"CREATE TABLE public.{name} (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL"
        f"{tenant_col})"
    )
    for n, value in enumerate(tenants or [None]):
        columns = "id, occurred_at" + (", tenant" if tenant_type else "")
        select = "g, %s::timestamptz - interval '40 days'" + (", %s" if tenant_type else "")
        params = [NOW] + ([value] if tenant_type else [])
        _sql(
            f"INSERT INTO public.{name} ({columns}) SELECT {select}"
            f" FROM generate_series({n * 1000 + 1}, {n * 1000 + rows_each}) AS g",
            params,
        )
    if tenant_type:
        _sql(f"CREATE INDEX ON public.{name} (tenant, id)")
    _sql(f"ANALYZE public.{name}")


def _policy(make_user, name: str, *, tenant: bool = True):
    return approved_policy(
        make_user,
        **events_spec(
            slug=name.replace("_", "-"),
            table=name,
            tenant="tenant" if tenant else None,
            keep=[],
            chunk_size=10,
        ),
    )


def _drain(policy) -> Run:
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def _left(name: str) -> dict:
    return dict(_sql(f"SELECT tenant::text, count(*) FROM public.{name} GROUP BY 1"))


@pytest.fixture
def officer(make_user):
    return make_user("hilda", "compliance")


# (column type, tenants in the table, the hold as written, its stored form, tenants it protects)
CASES = [
    ("citext", ["acme", "ACME", "other"], "ACME", "ACME", {"acme", "ACME"}),
    ("integer", ["1", "2"], "01", "1", {"1"}),
    ("bigint", ["7", "70"], " 007 ", "7", {"7"}),
    ("uuid", [UUID_A, UUID_B], UUID_A.upper(), UUID_A, {UUID_A}),
    ("text", ["acme", "ACME"], "acme", "acme", {"acme"}),
    ("character varying(10)", ["acme", "acme2"], "acme", "acme", {"acme"}),
    ('text COLLATE "C"', ["acme", "Acme"], "Acme", "Acme", {"Acme"}),
]


@pytest.mark.parametrize(("tenant_type", "tenants", "written", "stored", "protected"), CASES)
def test_a_hold_protects_exactly_what_the_tenant_types_equality_says(
    make_user, officer, tenant_type, tenants, written, stored, protected
):
    if tenant_type == "citext":
        _sql("CREATE EXTENSION IF NOT EXISTS citext")
    _table("rr_typed", tenant_type, tenants)
    policy = _policy(make_user, "rr_typed")

    hold = actions.place_hold(actor=officer, reason="case 7", policy=policy, tenant=written)
    run = _drain(policy)

    assert LegalHold.objects.get(pk=hold.pk).tenant == stored
    assert _left("rr_typed") == {value: 30 for value in protected}
    assert run.verification["deferred_by_holds"] == 30 * len(protected)


def test_a_nondeterministic_collation_decides_what_a_hold_covers(make_user, officer):
    try:
        with transaction.atomic():
            _sql(
                "CREATE COLLATION IF NOT EXISTS public.rr_ci"
                " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
            )
    except NotSupportedError:
        pytest.skip("this PostgreSQL build has no ICU")
    _table("rr_coll", "varchar(20) COLLATE public.rr_ci", ["Acme", "other"])
    policy = _policy(make_user, "rr_coll")

    actions.place_hold(actor=officer, reason="case 8", policy=policy, tenant="ACME")
    _drain(policy)

    assert _left("rr_coll") == {"Acme": 30}


def test_a_value_the_tenant_type_cannot_hold_is_refused_and_nothing_is_stored(make_user, officer):
    _table("rr_ints", "integer", ["1"])
    policy = _policy(make_user, "rr_ints")
    actions_before = OperatorAction.objects.count()

    with pytest.raises(ActionError) as excinfo:
        actions.place_hold(actor=officer, reason="case 9", policy=policy, tenant="acme")

    message = str(excinfo.value)
    assert "'acme'" in message and "rr-ints" in message and "integer" in message
    assert "\n" not in message
    assert LegalHold.objects.count() == 0
    assert OperatorAction.objects.count() == actions_before


def test_a_tenant_hold_on_a_policy_without_a_tenant_column_is_refused(make_user, officer):
    _table("rr_plain", None, [])
    policy = _policy(make_user, "rr_plain", tenant=False)
    with pytest.raises(ActionError, match="rr-plain has no tenant column"):
        actions.place_hold(actor=officer, reason="case 10", policy=policy, tenant="acme")
    assert LegalHold.objects.count() == 0


def test_a_tenant_hold_on_all_policies_says_what_it_covers_and_holds_tenantless_ones_whole(
    make_user, officer
):
    _table("rr_ints", "integer", ["1", "2"])
    _table("rr_texts", "text", ["01", "1"])
    _table("rr_plain", None, [])
    ints = _policy(make_user, "rr_ints")
    texts = _policy(make_user, "rr_texts")
    plain = _policy(make_user, "rr_plain", tenant=False)

    out = io.StringIO()
    args = ("hold", "place", "--reason", "case 11", "--by", "hilda", "--tenant", "01")
    token_for_claim(args)
    call_command("retention", *args, stdout=out)
    hold = LegalHold.objects.get()

    assert hold.tenant == "01"  # two types, two canonical forms: stored as written
    coverage = {c.policy: c.covers for c in hold_coverage_of(hold)}
    assert coverage == {
        "rr-ints": "tenant 1 (integer)",
        "rr-texts": "tenant 01 (text)",
        "rr-plain": "every row: the policy has no tenant column",
    }
    printed = out.getvalue()
    for line in (
        "rr-ints: tenant 1 (integer)",
        "rr-texts: tenant 01 (text)",
        "rr-plain: every row: the policy has no tenant column",
    ):
        assert line in printed
    logged = OperatorAction.objects.get(action="hold.place")
    assert {c["policy"]: c["covers"] for c in logged.details["coverage"]} == {
        "rr-ints": "tenant 1 (integer)",
        "rr-texts": "tenant 01 (text)",
        "rr-plain": "every row: the policy has no tenant column",
    }

    _drain(ints)
    _drain(texts)
    _drain(plain)
    assert _left("rr_ints") == {"1": 30}
    assert _left("rr_texts") == {"01": 30}
    assert _sql("SELECT count(*) FROM public.rr_plain")[0][0] == 30


def hold_coverage_of(hold):
    from retention.holds import coverage

    return coverage(hold)


def test_a_hold_on_all_policies_is_refused_when_a_tenant_type_cannot_hold_it(make_user, officer):
    _table("rr_ints", "integer", ["1"])
    _table("rr_texts", "text", ["acme"])
    _policy(make_user, "rr_ints")
    _policy(make_user, "rr_texts")

    args = ("hold", "place", "--reason", "case 12", "--by", "hilda", "--tenant", "acme")
    token_for_claim(args)
    with pytest.raises(CommandError, match="'acme' .*rr-ints.*integer"):
        call_command("retention", *args)
    assert LegalHold.objects.count() == 0


def test_a_version_whose_tenant_type_cannot_hold_an_active_hold_is_not_approved(make_user, officer):
    _table("rr_texts", "text", ["acme"])
    policy = _policy(make_user, "rr_texts")
    actions.place_hold(actor=officer, reason="case 13", policy=policy, tenant="acme")
    _table("rr_ints", "integer", ["1"])
    fields = events_spec(slug="rr-texts", table="rr_ints", tenant="tenant", keep=[], chunk_size=10)
    with pytest.raises(SpecError, match="legal hold #\\d+ .*'acme'.*integer"):
        actions.apply_spec(PolicySpec.parse(fields), author=officer)


def test_the_chunk_delete_keeps_its_key_range_index_scan_under_a_typed_hold(make_user, officer):
    _sql("CREATE EXTENSION IF NOT EXISTS citext")
    _table("rr_big", "citext", [f"t{n}" for n in range(10)], rows_each=900)
    policy = _policy(make_user, "rr_big")
    actions.place_hold(actor=officer, reason="case 14", policy=policy, tenant="T3")
    actions.place_hold(actor=officer, reason="case 15", tenant="t4", key_from=1, key_to=5)

    plans = dict(explain(policy))
    delete = "\n".join(plans["worker: chunk DELETE (rolled back)"])

    assert "Anti Join" in delete, delete
    assert "Index Scan using rr_big_tenant_id_idx" in delete, delete
    assert "Bitmap" not in delete and "Seq Scan on rr_big" not in delete, delete
    # the plans are of the statements a run created now would send: under the cutoff of the
    # wall clock's latest tick (not NOW's), every row, 40 days older than NOW, is eligible
    cutoff = policy.approved_version.parsed.cutoff_for(latest_tick(policy, datetime.now(UTC)))
    assert _sql("SELECT count(*) FROM public.rr_big WHERE occurred_at < %s", [cutoff]) == [(9000,)]


def test_the_holds_page_says_what_a_hold_covers_in_each_policy(make_user, officer, client):
    _table("rr_ints", "integer", ["1"])
    _table("rr_plain", None, [])
    _policy(make_user, "rr_ints")
    _policy(make_user, "rr_plain", tenant=False)
    client.force_login(officer)

    page = client.post(
        reverse("retention:hold_place"), {"tenant": "01", "reason": "case 16"}, follow=True
    ).content.decode()

    hold = LegalHold.objects.get()
    assert (
        f"hold #{hold.pk} placed — covers rr-ints: tenant 1 (integer) — 30 rows now; "
        "rr-plain: every row: the policy has no tenant column — 30 rows now"
    ) in page
    assert (
        '<div data-covers="rr-ints">rr-ints: tenant 1 (integer) — '
        '<span data-rows="30">30 rows now</span></div>'
    ) in page
    assert (
        '<div data-covers="rr-plain">rr-plain: every row: the policy has no tenant column — '
        '<span data-rows="30">30 rows now</span></div>'
    ) in page
    refused = client.post(
        reverse("retention:hold_place"),
        {"policy": "rr-ints", "tenant": "acme", "reason": "case 17"},
        follow=True,
    ).content.decode()
    assert "tenant &#x27;acme&#x27; is not a value of policy rr-ints" in refused
    assert LegalHold.objects.count() == 1
