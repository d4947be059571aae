"""The operators' commands both ways — ``manage.py retention`` with the database and
``retention`` as a client of a live gunicorn: listing runs and dead letters, replaying and
discarding every dead letter matching a run or a cause with one reason, retrying a run."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from core.models import OperatorAction
from core.tokens import create_token
from runs.models import DeadLetter, Run
from tests.dashboard.conftest import make_dead_letter

from .live import gunicorn, with_api, with_database
from .test_cli_both_ways import output

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with gunicorn() as url:
        yield url


def test_listing_and_bulk_decisions_print_the_same_both_ways(server, make_user):
    oncall = create_token(make_user("oscar", "oncall"), name="ops")[1]
    viewer = create_token(make_user("vera", "viewer"), name="ops")[1]
    letters = [make_dead_letter(make_user, slug=f"gone{i}", rows=200) for i in range(4)]
    runs = [letter.run for letter in letters]
    connection.close()

    def both(token, *args, mask=None):
        a, b = with_database(args, token=token), with_api(args, url=server, token=token)
        seen = [(r.returncode, *(re.sub(mask, "…", t) if mask else t for t in output(r)))
                for r in (a, b)]  # fmt: skip
        assert seen[0] == seen[1], (args, seen)
        return a

    listed = both(viewer, "runs").stdout
    for run in runs:
        assert run.run_key in listed
    assert "{" not in listed and "needs attention" not in listed
    assert both(viewer, "runs", "--policy", "gone1").stdout.count("\n") == 1
    typo = both(viewer, "runs", "--state", "atention")
    assert typo.returncode == 1 and "did you mean 'attention'" in typo.stderr
    letters_out = both(viewer, "dead-letters").stdout
    for letter in letters:
        assert f"#{letter.pk}  open  42P01  run {letter.run.run_key}" in letters_out
    assert "4 dead letter(s)" in letters_out
    one = both(viewer, "dead-letters", runs[0].run_key).stdout
    assert f"#{letters[0].pk} " in one and f"#{letters[1].pk} " not in one

    # one reason, every letter of a run: twin runs, one with the database, one as a client
    a = with_database(("replay", "--all", "--run", runs[0].run_key, "--reason", "INC-1 back"),
                      token=oncall)  # fmt: skip
    b = with_api(("replay", "--all", "--run", runs[1].run_key, "--reason", "INC-1 back"),
                 url=server, token=oncall)  # fmt: skip
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    mask = [re.sub(r"#\d+", "#…", r.stdout) for r in (a, b)]
    assert mask[0] == mask[1] == "1 dead letter(s) replayed: #…\n"
    # by cause, the rest at once: one operator-log row listing both ids
    c = with_api(("discard", "--all", "--cause", "42P01", "--reason", "tables gone for good"),
                 url=server, token=oncall)  # fmt: skip
    assert c.returncode == 0, c.stderr
    assert c.stdout == f"2 dead letter(s) discarded: #{letters[2].pk}, #{letters[3].pk}\n"
    row = OperatorAction.objects.get(action="dead_letter.discard_many")
    assert row.details["dead_letters"] == [letters[2].pk, letters[3].pk]
    assert row.reason == "tables gone for good"
    assert not DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN).exists()
    none = both(oncall, "replay", "--all", "--reason", "again")
    assert none.returncode == 1 and "no open dead letter matches" in none.stderr
    assert both(viewer, "dead-letters").stdout == "no open dead letters\n"
    assert Run.objects.filter(pk__in=[r.pk for r in runs[:2]], state=Run.State.ACTIVE).count() == 2


def test_evidence_files_are_the_same_both_ways(server, make_user, tmp_path):
    auditor = create_token(make_user("audrey", "auditor"), name="ops")[1]
    letter = make_dead_letter(make_user, slug="gone", rows=200)
    key = letter.run.run_key
    connection.close()
    a = with_database(("evidence", key, "--csv", str(tmp_path / "a.csv"), "--manifest",
                       str(tmp_path / "a.json")), token=auditor)  # fmt: skip
    b = with_api(("evidence", key, "--csv", str(tmp_path / "b.csv"), "--manifest",
                  str(tmp_path / "b.json")), url=server, token=auditor)  # fmt: skip
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout.replace("a.csv", "b.csv").replace("a.json", "b.json") == b.stdout
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
