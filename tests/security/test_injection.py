"""Hostile strings through every path that reaches SQL: policy files (``retention policy
apply`` and the web upload), CLI arguments (--tenant, --period, --policy, run keys, reasons)
and the web forms (holds, run controls, list filters). Each input either fails with one clear
error or is stored and matched literally — and no table is dropped, created or changed.

Defects found here (NUL characters, a trailing newline in a slug, an overlong tenant, a
timezone naming a directory) are fixed; their cases stand as tests at the end.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.models import OperatorAction
from retention.models import LegalHold, Policy
from runs.actions import trigger_run
from runs.models import Run
from tests.conftest import token_for_claim
from tests.factories import approved_policy
from tests.runs.conftest import NOW, create_events

HOSTILE = [
    "x; DROP TABLE rr_inj",
    "rr_inj; DROP TABLE rr_inj; --",
    "'; DROP TABLE rr_inj; --",
    '"; DROP TABLE rr_inj; --',
    "x' OR '1'='1",
    "1) OR (1=1",
    "$$; DROP TABLE rr_inj; $$",
    "E'\\x00'",
    "%s %(x)s {0} {}",
    "\\'; SELECT pg_sleep(10); --",
    "ｔｅｎａｎｔ",  # fullwidth
    "tenant\u200b",  # zero-width space
    "naïve ☃ \u00e9\u0301 \U0001f600",
    "a\nb",
    "a\rb\tc",
    "--",
    "/* */",
    "",
    " ",
    "x" * 300,
]

# Text a process can receive in argv (no NUL: execve cannot carry it).
ARGV_TEXT = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
    st.builds(
        lambda a, b: a + b,
        st.sampled_from(HOSTILE),
        st.text(
            st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8
        ),
    ),
)
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fingerprint() -> tuple:
    """The tables of the public schema and the exact content of the fuzzed target."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT array_agg(tablename ORDER BY tablename) FROM pg_tables WHERE schemaname = 'public'"
        )
        tables = tuple(cur.fetchone()[0])
        cur.execute(
            "SELECT count(*), md5(string_agg(t::text, ',' ORDER BY id)) FROM public.rr_inj t"
        )
        content = cur.fetchone()
    return tables, content


@pytest.fixture
def fortress(db, make_user):
    """rr_inj (600 rows, with a shadow), an approved policy on it, a run, and the people."""
    create_events(600, name="rr_inj")
    alice = make_user("alice", "compliance")
    make_user("bob", "compliance")
    olga = make_user("olga", "oncall")
    policy = approved_policy(
        make_user, slug="inj", table="public.rr_inj", key="id", timestamp="occurred_at",
        tenant="tenant_id", retention="20 days", schedule="0 3 * * *", chunk_size=100,
    )  # fmt: skip
    run, _ = trigger_run(policy, tick=NOW)
    before = fingerprint()
    yield {"alice": alice, "olga": olga, "policy": policy, "run": run}
    assert fingerprint() == before


def cli(*args: str) -> tuple[str | None, str]:
    """Run ``manage.py retention ...`` in-process; (output, '') or (None, error line)."""
    token_for_claim(args)
    out = StringIO()
    try:
        with transaction.atomic():  # a database error must not poison the test's transaction
            call_command("retention", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        message = str(exc)
        assert message.strip(), "an empty error"
        assert "Traceback" not in message
        return None, message
    return out.getvalue(), ""


def toml_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\' or ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


POLICY_FIELDS = {
    "slug": '"inj-fuzz"',
    "table": '"public.rr_inj"',
    "key": '"id"',
    "timestamp": '"occurred_at"',
    "tenant": '"tenant_id"',
    "retention": '"20 days"',
    "schedule": '"0 3 * * *"',
    "timezone": '"UTC"',
    "name": '"fuzzed"',
    "owner": '"team"',
}


def policy_text(field: str, value: str) -> str:
    fields = dict(POLICY_FIELDS)
    keep = '[[keep]]\ncolumn = "status"\nop = "="\nvalue = "disputed"\n'
    if field == "keep column":
        keep = keep.replace('"status"', toml_string(value))
    elif field == "keep value":
        keep = keep.replace('"disputed"', toml_string(value))
    else:
        fields[field] = toml_string(value)
    return "\n".join(f"{k} = {v}" for k, v in fields.items()) + "\n" + keep


TOML_TEXT = st.one_of(
    st.sampled_from(HOSTILE), st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
)


@FUZZ
@given(
    field=st.sampled_from([*POLICY_FIELDS, "keep column", "keep value"]),
    value=TOML_TEXT,
)
def test_a_hostile_policy_file_is_refused_in_one_line_or_taken_literally(
    fortress, tmp_path_factory, field, value
):
    path = tmp_path_factory.mktemp("p") / "policy.toml"
    path.write_text(policy_text(field, value), encoding="utf-8")
    output, error = cli(
        "policy", "apply", str(path), "--author", "alice", "--reason", "ready for review"
    )
    if output is None:
        assert "\n" not in error.strip(), error
        return
    # accepted: the value is stored as given (it was data, not SQL)
    slug, number = output.split()[0], int(output.split()[1].lstrip("v"))
    stored = Policy.objects.get(slug=slug).versions.get(number=number).parsed
    if field == "keep value":
        assert stored.keep[0].value == value
    elif field in ("name", "owner"):
        assert getattr(stored, field) in (value, value.strip())


@FUZZ
@given(tenant=ARGV_TEXT, reason=ARGV_TEXT)
def test_a_hostile_tenant_or_reason_on_the_cli_is_stored_literally(fortress, tenant, reason):
    output, error = cli(
        "hold", "place", "--by", "alice", "--policy", "inj", "--tenant", tenant, "--reason", reason
    )
    if output is None:
        assert error
        return
    hold = LegalHold.objects.order_by("-pk").first()
    assert hold.reason == reason.strip()
    assert hold.tenant == (tenant.strip() or None)
    # a hostile tenant is a value: it matches no row, so it holds nothing
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.rr_inj WHERE tenant_id::text = %s", [hold.tenant])
        matched = cur.fetchone()[0]
    assert matched == 0 or (hold.tenant or "").isdigit()


@FUZZ
@given(text=ARGV_TEXT)
def test_hostile_policy_slugs_periods_and_run_keys_are_one_clear_error(fortress, text):
    assume(text.strip() and not text.strip().isdigit())  # '' is "all"; a number is a run id
    for args in (
        ("trigger", text, "--by", "olga"),
        ("status", text),
        ("pause", text, "--reason", "r", "--by", "olga"),
        ("check", text),
        ("hold", "place", "--by", "alice", "--reason", "r", "--policy", text),
        ("policy", "approve", text, "--version", "1", "--approver", "bob"),
        ("policy", "preview", text),
    ):
        output, error = cli(*args)
        assert output is None and error, args
    output, error = cli("trigger", "inj", "--period", text, "--by", "olga")
    if output is not None:  # a well-formed date: the run of that period, literally
        assert Run.objects.filter(run_key=output.strip()).exists()
    else:
        assert "--period" in error or "no approved" in error or "future" in error


@FUZZ
@given(tenant=ARGV_TEXT, policy=ARGV_TEXT, reason=ARGV_TEXT, key_from=ARGV_TEXT)
def test_the_hold_form_refuses_or_stores_hostile_fields_literally(
    fortress, client, tenant, policy, reason, key_from
):
    client.force_login(fortress["alice"])
    holds = LegalHold.objects.count()
    response = client.post(
        "/policies/holds/place/",
        {"tenant": tenant, "policy": policy, "reason": reason, "key_from": key_from},
    )
    assert response.status_code == 302
    if LegalHold.objects.count() > holds:
        hold = LegalHold.objects.order_by("-pk").first()
        assert hold.reason == reason.strip()
        assert hold.tenant == (tenant.strip() or None)


@FUZZ
@given(reason=ARGV_TEXT, policy=ARGV_TEXT, state=ARGV_TEXT)
def test_run_controls_and_list_filters_take_hostile_text_as_data(
    fortress, client, reason, policy, state
):
    client.force_login(fortress["olga"])
    run = fortress["run"]
    actions = OperatorAction.objects.count()
    response = client.post(f"/runs/{run.pk}/pause/", {"reason": reason})
    assert response.status_code == 302
    if OperatorAction.objects.count() > actions:
        assert OperatorAction.objects.order_by("-pk").first().reason == reason.strip()
        client.post(f"/runs/{run.pk}/resume/", {"reason": "fuzz"})
    listing = client.get("/runs/", {"policy": policy, "state": state})
    # a state that is not a run state, or a control character, is one clear error
    # (tests/dashboard/test_filters.py); anything else is matched literally
    assert listing.status_code in (200, 400)
    if state.strip() not in ("", *Run.State.values):
        assert listing.status_code == 400 and "filter state: must be one of" in listing.text


@FUZZ
@given(field=st.sampled_from([*POLICY_FIELDS, "keep column", "keep value"]), value=TOML_TEXT)
def test_a_hostile_policy_upload_on_the_web_is_refused_or_taken_literally(
    fortress, client, field, value
):
    client.force_login(fortress["alice"])
    response = client.post("/policies/drafts/", {"toml": policy_text(field, value)})
    assert response.status_code in (302, 400)


# -- defects found by the fuzzing above --------------------------------------------------------


def test_a_nul_character_in_the_hold_form_is_one_clear_error(fortress, client):
    client.force_login(fortress["alice"])
    response = client.post("/policies/holds/place/", {"tenant": "a\x00b", "reason": "x"})
    assert response.status_code in (302, 400)


def test_a_nul_in_a_policy_name_is_one_clear_error(fortress, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(policy_text("name", "a\x00b"), encoding="utf-8")
    output, error = cli(
        "policy", "apply", str(path), "--author", "alice", "--reason", "ready for review"
    )
    assert output is None and error


def test_a_slug_with_a_trailing_newline_is_refused(fortress, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(policy_text("slug", "inj-fuzz\n"), encoding="utf-8")
    output, error = cli(
        "policy", "apply", str(path), "--author", "alice", "--reason", "ready for review"
    )
    assert output is None and "slug" in error


def test_an_overlong_tenant_is_one_clear_error(fortress, client):
    output, error = cli(
        "hold", "place", "--by", "alice", "--policy", "inj", "--tenant", "x" * 300, "--reason", "r"
    )
    assert output is None and "tenant" in error


@pytest.mark.parametrize("tz", ["America", "x" * 300])
def test_a_timezone_that_names_a_directory_is_one_clear_error(fortress, tmp_path, tz):
    path = tmp_path / "policy.toml"
    path.write_text(policy_text("timezone", tz), encoding="utf-8")
    output, error = cli(
        "policy", "apply", str(path), "--author", "alice", "--reason", "ready for review"
    )
    assert output is None and "timezone" in error
