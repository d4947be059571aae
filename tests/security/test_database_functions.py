"""What the worker login reaches through the database's own functions, attacked with the
login `retention grants apply` gives it (docs/security.md, finding 7 of the review):

- it pauses a policy for a critical guard reading, and lifts no pause at all — not the
  guard's own, and not an on-call engineer's pause whose reason was typed to look like the
  guard's ("guard critical…" is text anyone can type);
- ``guard_table_signals`` answers only for the table of an approved policy, not for any other
  relation of the database."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from retention.actions import pause_policy, resume_policy
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import create_events
from tests.security.roles import connect_as
from tests.security.test_logins import logins  # noqa: F401 — the fixture

pytestmark = pytest.mark.django_db(transaction=True)

LIFT = "UPDATE retention_policy SET paused = false, paused_reason = '' WHERE id = %s"
SIGNALS = "SELECT * FROM guard_table_signals(%s::regclass, ARRAY['AccessExclusiveLock'])"


def test_the_worker_login_lifts_no_pause_not_even_one_typed_as_the_guards(logins, make_user):  # noqa: F811
    oncall = make_user("oscar", "oncall")
    typed = approved_policy(make_user, **events_spec(slug="typed"))
    pause_policy(typed, actor=oncall, reason="guard critical: typed by on-call during INC-4")
    guarded = approved_policy(make_user, **events_spec(slug="guarded"))
    pause_policy(guarded, actor="guard", reason="guard critical: lock waits 12", alert=True)
    unpaused = approved_policy(make_user, **events_spec(slug="unpaused"))
    with connect_as(*logins["worker"]) as conn:
        for policy in (typed, guarded):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="on-call"):
                conn.execute(LIFT, [policy.pk])
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "UPDATE retention_policy SET paused_reason = 'guard critical: other'"
                    " WHERE id = %s",
                    [policy.pk],
                )
        # what the guard needs still works: pausing an unpaused policy at a critical reading
        conn.execute(
            "UPDATE retention_policy SET paused = true, paused_reason = 'guard critical: lag'"
            " WHERE id = %s",
            [unpaused.pk],
        )
        # and nothing else: an unpaused policy paused under another reason
        other = approved_policy(make_user, **events_spec(slug="other"))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "UPDATE retention_policy SET paused = true, paused_reason = 'maintenance'"
                " WHERE id = %s",
                [other.pk],
            )
    for policy in (typed, guarded, unpaused):
        policy.refresh_from_db()
        assert policy.paused, policy.slug
    assert typed.paused_reason == "guard critical: typed by on-call during INC-4"
    # an on-call engineer lifts either pause (the pages' and the CLI's resume)
    resume_policy(guarded, actor=oncall, reason="lock waits over")
    guarded.refresh_from_db()
    assert not guarded.paused


def test_guard_table_signals_answers_only_for_an_approved_policys_table(logins, make_user):  # noqa: F811
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE public.rr_payroll (id bigint PRIMARY KEY)")
    create_events(50, name="rr_drafts")
    try:
        approved_policy(make_user, **events_spec())  # public.rr_events
        # a policy on rr_drafts whose only version is submitted, not approved
        from retention import actions
        from retention.spec import PolicySpec

        author = make_user("ann", "compliance")
        draft = actions.apply_spec(
            PolicySpec.parse(events_spec(slug="drafts", table="rr_drafts")), author=author
        )
        actions.submit_version(draft, actor=author, reason="for review")
        with connect_as(*logins["worker"]) as conn:
            in_flight, waits, conflicting, vacuum = conn.execute(
                SIGNALS, ["public.rr_events"]
            ).fetchone()
            assert (in_flight, waits, conflicting, vacuum) == (False, 0, [], False)
            for relation in (
                "public.rr_payroll",
                "public.rr_drafts",
                "pg_catalog.pg_authid",
                "retention_runner.auth_user",
            ):
                with pytest.raises(
                    psycopg.errors.InsufficientPrivilege, match="not the table of an approved"
                ):
                    conn.execute(SIGNALS, [relation])
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS public.rr_payroll, public.rr_drafts")
