"""The policy page's form editor for the common fields: it edits the base version's spec,
writes the policy file with the same writer, and goes through the TOML upload's action."""

from __future__ import annotations

import pytest
from django.urls import reverse

from core.models import OperatorAction
from retention.models import PolicyVersion
from retention.spec import PolicySpec, load_toml
from tests.factories import events_spec

from .helpers import post

pytestmark = pytest.mark.django_db

EDITED = dict(
    name="Events older than 10 days",  # the name follows the retention the form changed
    retention="10 days",
    schedule="30 2 * * *",
    chunk_size=500,
    keep=[
        {"column": "status", "op": "=", "value": "disputed"},
        {"column": "status", "op": "in", "values": ["void", "appeal"]},
    ],
)


def _form(**overrides) -> dict:
    data = {
        "editor": "form",
        "slug": "events",
        "base": "1",
        "retention": "10 days",
        "schedule": "30 2 * * *",
        "chunk_size": "500",
        "keep-0-column": "status",
        "keep-0-op": "=",
        "keep-0-value": '"disputed"',
        "keep-1-column": "status",
        "keep-1-op": "in",
        "keep-1-value": '["void", "appeal"]',
        "keep-2-column": "",
        "keep-2-op": "",
        "keep-2-value": "",
    }
    data.update(overrides)
    return data


def _toml(**overrides) -> str:
    return PolicySpec.parse(events_spec(**{**EDITED, **overrides})).to_toml()


def test_the_policy_page_offers_the_form_filled_from_the_approved_version(
    events_policy, client_for
):
    html = client_for("compliance").get(reverse("retention:policy_detail", args=["events"]))
    html = html.content.decode()

    assert 'data-testid="form-editor"' in html
    assert 'name="retention" value="20 days"' in html
    assert 'name="chunk_size" value="200"' in html
    assert 'name="keep-0-column" value="status"' in html
    assert 'name="keep-0-value" value="&quot;disputed&quot;"' in html


def test_the_form_and_the_equivalent_toml_make_the_same_version(events_policy, client_for):
    client = client_for("compliance")
    page = "/policies/events/"

    post(client, reverse("retention:version_create"), _form(), page=page)
    by_form = PolicyVersion.objects.get(policy=events_policy, number=2)
    post(client, reverse("retention:version_create"), {"toml": _toml()}, page=page)

    assert by_form.content_hash == load_toml(_toml()).content_hash()
    assert by_form.parsed.retention == "10 days" and by_form.parsed.chunk_size == 500
    assert [r.to_json() for r in by_form.parsed.keep] == EDITED["keep"]
    assert by_form.parsed.table == "rr_events" and by_form.parsed.tenant == "tenant_id"
    # the TOML upload found the same content: no third version
    assert PolicyVersion.objects.filter(policy=events_policy).count() == 2


@pytest.mark.parametrize(
    ("field", "form_value", "toml_line"),
    [
        ("chunk_size", "0", "chunk_size = 0"),
        ("retention", "10 fortnights", 'retention = "10 fortnights"'),
    ],
)
def test_a_bad_value_in_the_form_gives_the_toml_paths_error_and_changes_nothing(
    events_policy, client_for, field, form_value, toml_line
):
    good = {"chunk_size": "chunk_size = 500", "retention": 'retention = "10 days"'}[field]
    bad_toml = _toml().replace(good, toml_line)
    assert bad_toml != _toml()
    client = client_for("compliance")
    page = "/policies/events/"
    before = (PolicyVersion.objects.count(), OperatorAction.objects.count())

    by_toml = post(
        client,
        reverse("retention:version_create"),
        {"toml": bad_toml},
        page=page,
    )
    by_form = post(
        client, reverse("retention:version_create"), _form(**{field: form_value}), page=page
    )

    assert by_toml.status_code == by_form.status_code == 400
    errors = [str(m) for m in by_toml.context["messages"]]
    # the form stays on the policy page, the same error beside its field
    assert errors == [by_form.context["form"]["error"]] and field in errors[0]
    assert by_form.context["form"]["error_field"] == field
    assert by_form.context["form"][field] == form_value
    assert (PolicyVersion.objects.count(), OperatorAction.objects.count()) == before


def test_a_keep_value_that_is_not_a_toml_value_is_one_clear_error(events_policy, client_for):
    before = PolicyVersion.objects.count()
    page = post(
        client_for("compliance"),
        reverse("retention:version_create"),
        _form(**{"keep-0-value": "disputed"}),
        page="/policies/events/",
    )

    assert page.status_code == 400
    assert page.context["form"]["error"] == (
        'keep rule 1: value disputed is not a TOML value (text goes in quotes: "disputed")'
    )
    assert page.context["form"]["error_field"] == "keep"
    assert 'data-field-error="keep"' in page.content.decode()
    assert PolicyVersion.objects.count() == before


def test_the_name_follows_a_changed_retention_unless_it_was_edited(events_policy, client_for):
    client = client_for("compliance")
    page = "/policies/events/"
    html = client.get(page).content.decode()
    assert 'name="name" value="Events older than 20 days"' in html

    post(client, reverse("retention:version_create"), _form(name="Events older than 20 days"))
    assert PolicyVersion.objects.get(number=2).parsed.name == "Events older than 10 days"

    post(
        client,
        reverse("retention:version_create"),
        _form(retention="15 days", name="Marketplace events (legal review 2026)"),
    )
    assert (
        PolicyVersion.objects.get(number=3).parsed.name == "Marketplace events (legal review 2026)"
    )


def test_a_keep_rule_the_table_refuses_is_named_as_its_row_is_labelled_and_marked(
    events_policy, client_for
):
    # row 1 left empty: the policy file's second rule (keep[1]) is the form's third row
    form = _form(**{"keep-0-column": "", "keep-0-op": "", "keep-0-value": ""})
    form.update({"keep-2-column": "stauts", "keep-2-op": "=", "keep-2-value": '"void"'})
    page = post(client_for("compliance"), reverse("retention:version_create"), form,
                page="/policies/events/")  # fmt: skip

    assert page.status_code == 400
    error = page.context["form"]["error"]
    assert error.startswith("keep rule 3 column 'stauts' does not exist") and "keep[" not in error
    assert "did you mean 'status'" in error
    html = page.content.decode()
    row = html.split("data-row-error>", 1)[1].split("</tr>", 1)[0]
    assert row.count('aria-invalid="true"') == 3 and 'name="keep-2-column"' in row
    assert html.count('aria-invalid="true"') == 3
    assert 'id="error-keep"' in html


def test_a_drafts_page_is_headed_with_the_drafts_own_name(events_policy, client_for):
    client = client_for("compliance")
    post(client, reverse("retention:version_create"),
         _form(name="Marketplace events (legal review 2026)"), page="/policies/events/")  # fmt: skip
    html = client.get(reverse("retention:version_detail", args=["events", 2])).content.decode()
    heading = html.split("<h1>", 1)[1].split("</h1>", 1)[0]
    assert "Marketplace events (legal review 2026)</a> v2" in heading
    assert "Events older than 20 days" not in heading
