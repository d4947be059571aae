"""The ``[archive]`` section: declared in the field table, checked when parsed and at apply."""

from __future__ import annotations

import pytest
from django.db import connection

from retention import actions
from retention.models import PolicyVersion
from retention.spec import FIELD_BY_PATH, PolicySpec, SpecError, load_toml, reference_table
from tests.archive.conftest import create_typed, read_only, typed_spec
from tests.factories import events_spec


def test_the_archive_keys_are_in_the_field_table_and_round_trip_through_toml(tmp_path):
    assert {"archive.to", "archive.restore_days", "archive.keep_years"} <= set(FIELD_BY_PATH)
    assert "`[archive] to`" in reference_table()
    spec = PolicySpec.parse(typed_spec(tmp_path))
    assert spec.archive_dir == str(tmp_path) and spec.restore_days == 30
    again = load_toml(spec.to_toml())
    assert again == spec and again.content_hash() == spec.content_hash()
    assert '[archive]\nto = "file://' in spec.to_toml()
    kept = PolicySpec.parse(typed_spec(tmp_path, keep_years=7))
    assert kept.archive_keep_years == 7 and "keep_years = 7" in kept.to_toml()
    assert load_toml(kept.to_toml()) == kept and kept.content_hash() != spec.content_hash()


def test_a_policy_without_archive_keeps_its_content_hash():
    spec = PolicySpec.parse(events_spec())
    assert "archive_to" not in spec.to_json() and "archive_restore_days" not in spec.to_json()
    assert "archive_keep_years" not in spec.to_json()


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        ({"to": "srv/archive"}, 'archive.to must be a URL like "file:///srv/archive/events"'),
        ({"to": "file://relative/dir"}, "archive.to must name an absolute directory"),
        ({"to": "file:///srv/../etc"}, "without . or .."),
        ({"to": "s3://bucket/x"}, "archive.to must be a URL like"),
        ({"restore_days": 10}, "archive.restore_days applies only with archive.to"),
        ({"to": "file:///srv/a", "restore_days": 0}, "archive.restore_days must be between 1"),
        ({"to": "file:///srv/a", "keep_forever": True}, "unknown key in archive: keep_forever"),
        ({"keep_years": 7}, "archive.keep_years applies only with archive.to"),
        ({"to": "target:vault/archive.e", "keep_years": 7}, 'only with archive.to = "file:///DIR"'),
        ({"to": "file:///srv/a", "keep_years": 0}, "archive.keep_years must be between 1"),
        ({"to": "file:///srv/a", "keep_years": 101}, "archive.keep_years must be between 1"),
    ],
)
def test_a_malformed_archive_section_is_refused_with_one_line(archive, message):
    with pytest.raises(SpecError) as refused:
        PolicySpec.parse(events_spec(archive=archive))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_apply_refuses_a_directory_that_is_missing_or_read_only(db, make_user, tmp_path):
    create_typed(50)
    author = make_user("alice", "compliance")
    missing = tmp_path / "missing"
    with pytest.raises(SpecError, match=f"archive.to: {missing} is not an existing directory"):
        actions.apply_spec(PolicySpec.parse(typed_spec(missing)), author=author)
    directory = tmp_path / "ro"
    directory.mkdir()
    with read_only(directory), pytest.raises(SpecError) as refused:
        actions.apply_spec(PolicySpec.parse(typed_spec(directory)), author=author)
    assert str(refused.value).startswith(f"archive.to: {directory} is not writable (")
    assert not PolicyVersion.objects.exists()
    version = actions.apply_spec(PolicySpec.parse(typed_spec(directory)), author=author)
    assert version.parsed.archive_dir == str(directory)
    assert not list(directory.iterdir())  # the probe file is gone


def test_an_archiving_policy_of_a_table_with_cascades_is_refused(db, make_user, tmp_path):
    create_typed(50)
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.rr_typed_child (id bigint REFERENCES public.rr_typed (id)"
            " ON DELETE CASCADE)"
        )
    spec = PolicySpec.parse(typed_spec(tmp_path, cascade_ack=["public.rr_typed_child"]))
    with pytest.raises(SpecError) as refused:
        actions.apply_spec(spec, author=make_user("alice", "compliance"))
    assert str(refused.value).startswith("[archive] cannot go with ON DELETE CASCADE")
    assert "public.rr_typed_child" in str(refused.value)
