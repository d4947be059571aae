"""Decisions are proven by the person who made them (issue: no database login and no single
token can approve, release a hold or make an approver).

Each attack runs as the login it used, with the grants `retention grants apply` ships: the
operator login now writes nothing at all; the web login — the one login that still writes
decisions — forges an approval, a hold's release and operator-log rows in colleagues' names,
and none of them deletes a row, while `retention audit verify` names each one. A task signed
with the right SECRET_KEY but not made by the product, queued with the worker login, is
refused by a real cleanup cluster."""

from __future__ import annotations

import io
import os
import pickle
import secrets
import signal
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.signing import SignedPackage
from psycopg import sql

from core.oplog import record_action
from retention import actions, decisions
from retention.models import LegalHold, PolicyVersion
from retention.spec import PolicySpec
from runs.actions import ActionError, trigger_run
from runs.engine import worker
from runs.models import AuditRecord
from tests.factories import events_spec
from tests.runs.conftest import NOW
from tests.security.roles import apply_grants, connect_as

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_guard")]

KINDS = ("web", "worker", "operator", "monitor")
TARGET = "public.rr_events"


@pytest.fixture
def logins(events):
    """One real login per kind, granted by `retention grants apply`; dropped afterwards."""
    made = {}
    with connection.cursor() as cur:
        for kind in KINDS:
            role = f"rr_{kind}_{os.getpid()}_{secrets.token_hex(3)}"
            password = secrets.token_urlsafe(16)
            cur.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}")
                .format(sql.Identifier(role), sql.Literal(password))
                .as_string(cur.connection)
            )
            made[kind] = (role, password)
    for kind, (role, _) in made.items():
        apply_grants(kind, role, TARGET)
    yield made
    with connection.cursor() as cur:
        cur.execute("RESET ROLE")
        for role, _ in made.values():
            for statement in ("DROP OWNED BY {}", "DROP ROLE {}"):
                cur.execute(
                    sql.SQL(statement).format(sql.Identifier(role)).as_string(cur.connection)
                )


class acting_as:
    """The product's own code (``record_action``) on Django's connection, with the privileges
    of ``role``: what a process holding only that login's password can do."""

    def __init__(self, role: str):
        self.role = role

    def __enter__(self):
        with connection.cursor() as cur:
            cur.execute(
                sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)).as_string(cur.connection)
            )

    def __exit__(self, *exc):
        with connection.cursor() as cur:
            cur.execute("RESET ROLE")


def refused(conn, statement, params=()) -> bool:
    try:
        conn.execute(statement, params)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


def rows() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.rr_events")
        return cur.fetchone()[0]


def held_rows(cutoff) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM public.rr_events WHERE tenant_id = 1 AND occurred_at < %s",
            [cutoff],
        )
        return cur.fetchone()[0]


def audit_verify() -> str:
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("retention", "audit", "verify", stdout=io.StringIO(), stderr=err)
    return err.getvalue()


def test_the_operator_login_writes_no_decision_hold_person_operator_log_row_or_task(
    logins, events_policy, make_user
):
    """Finding 1 and 2 as the operator login itself: every write it used is refused by the
    database (operators decide over the API, where the web process signs)."""
    version = events_policy.approved_version
    carol = make_user("carol", "compliance")
    hold = actions.place_hold(actor=carol, reason="litigation", policy=events_policy)
    with connect_as(*logins["operator"]) as conn:
        for statement, params in (
            ("UPDATE retention_policyversion SET decided_by_id = %s WHERE id = %s",
             [carol.pk, version.pk]),
            ("UPDATE retention_legalhold SET released_by = 'x', released_at = now(),"
             " release_requested_by = 'y', release_requested_at = now() WHERE id = %s",
             [hold.pk]),
            ("INSERT INTO retention_operatoraction (at, actor, action, target_type, target_id,"
             " reason, details, chain_seq, prev_hash, hash) VALUES (now(), 'carol', 'x', 'x',"
             " 'x', '', '{}', 999999, 'x', 'x')", []),
            ("INSERT INTO signatures_signature (kind, subject, content, signature, signed_at)"
             " VALUES ('version.approve', 'x', '{}', 'x', now())", []),
            ("INSERT INTO django_q_ormq (key, payload, lock) VALUES ('cleanup', 'x', NULL)", []),
            ("INSERT INTO django_q_schedule (func, schedule_type, repeats, next_run)"
             " VALUES ('runs.tasks.reconcile', 'O', 1, now())", []),
            ("INSERT INTO auth_user_groups (user_id, group_id) SELECT %s, id FROM auth_group"
             " LIMIT 1", [carol.pk]),
        ):  # fmt: skip
            assert refused(conn, statement, params), statement


def test_decisions_forged_with_a_database_login_delete_nothing_and_audit_verify_names_each(
    logins, events_policy, make_user, monkeypatch
):
    """Finding 1, with the one login that still writes decisions (the web's): an approval and a
    hold's release typed in colleagues' names, and operator-log rows written through the
    product's own ``record_action`` with that login alone. The scheduler refuses the version,
    the workers delete nothing with it, the hold stays in force, and `audit verify` names each
    forged row."""
    carol = make_user("carol", "compliance")
    make_user("dave", "compliance")
    erin = make_user("erin", "compliance")
    web = logins["web"][0]
    v1 = events_policy.approved_version
    cutoff = v1.parsed.cutoff_for(NOW)
    hold = actions.place_hold(actor=carol, reason="litigation", policy=events_policy, tenant="1")
    held_before = held_rows(cutoff)
    assert held_before > 0
    # carol writes and submits a 1-day retention; no one approves it
    v2 = actions.apply_spec(
        PolicySpec.parse(events_spec(retention="1 day", name="Events older than 1 day")),
        author=carol,
    )
    v2 = actions.submit_version(v2, actor=carol, reason="shorter")

    with acting_as(web), connection.cursor() as cur:
        # the hold's release, with two names typed
        cur.execute(
            "UPDATE retention_legalhold SET release_requested_by = 'dave',"
            " release_requested_at = now(), release_request_reason = 'case closed',"
            " released_by = 'erin', released_at = now(), release_reason = 'confirmed'"
            " WHERE id = %s",
            [hold.pk],
        )
        record_action("dave", "hold.release_request", hold, reason="case closed")
        record_action("erin", "hold.release", hold, reason="confirmed")
    decisions.forget()

    # a run of the genuine version: the held tenant keeps every row
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    run.refresh_from_db()
    assert run.state == "drained"
    assert AuditRecord.objects.filter(run=run).exists()  # the run did delete other tenants' rows
    assert held_rows(cutoff) == held_before
    after_first = rows()

    with acting_as(web), connection.cursor() as cur:
        # carol's own version approved under erin's name, the genuine one superseded
        cur.execute(
            "UPDATE retention_policyversion SET state = 'superseded' WHERE id = %s", [v1.pk]
        )
        cur.execute(
            "UPDATE retention_policyversion SET state = 'approved', decided_by_id = %s,"
            " decided_at = now(), decision_reason = 'fine', approved_hash = content_hash"
            " WHERE id = %s",
            [erin.pk, v2.pk],
        )
        record_action("erin", "version.approve", v2, reason="fine")
    v2.refresh_from_db()
    assert v2.state == PolicyVersion.State.APPROVED

    # the scheduler (and a manual trigger) refuses the version
    with pytest.raises(ActionError, match="does not verify"):
        trigger_run(events_policy, tick=NOW + timedelta(days=1))
    # a run of it made anyway (as if the scheduler did not check): the workers refuse each chunk
    monkeypatch.setattr("runs.actions.decisions.approval_refusal", lambda version: "")
    forged_run, _ = trigger_run(events_policy, tick=NOW + timedelta(days=1))
    monkeypatch.undo()
    assert forged_run.policy_version_id == v2.pk
    stats = worker.drain(forged_run.pk, budget_s=30, until_idle=True)
    assert stats["rows"] == 0
    assert rows() == after_first
    assert not AuditRecord.objects.filter(run=forged_run).exists()
    assert LegalHold.objects.get(pk=hold.pk).released_by == "erin"  # the row says released...
    assert held_rows(cutoff) == held_before  # ...and the rows are all there

    problems = audit_verify()
    assert f"the approval of {v2} does not verify" in problems
    assert f"the release request of hold #{hold.pk} does not verify" in problems
    for action, who in (
        ("hold.release_request", "dave"),
        ("hold.release", "erin"),
        ("version.approve", "erin"),
    ):
        assert f"({action} by {who}): no signature of oplog" in problems, problems


def test_a_genuine_release_and_approval_verify_and_take_effect(events_policy, make_user):
    """The same decisions made through the product are signed and act: the control for the
    test above (its refusals are the signatures', not something else's)."""
    carol, dave = make_user("carol", "compliance"), make_user("dave", "compliance")
    hold = actions.place_hold(actor=carol, reason="litigation", policy=events_policy, tenant="1")
    held_before = held_rows(events_policy.approved_version.parsed.cutoff_for(NOW))
    actions.request_hold_release(hold, actor=carol, reason="case closed")
    actions.approve_hold_release(hold, actor=dave, reason="confirmed")
    assert hold.pk in decisions.verified_release_ids()
    assert decisions.approval_refusal(events_policy.approved_version) == ""
    run, _ = trigger_run(events_policy, tick=NOW)
    worker.drain(run.pk, budget_s=60, until_idle=True)
    cutoff = events_policy.approved_version.parsed.cutoff_for(NOW)
    assert held_rows(cutoff) < held_before / 2  # tenant 1's old rows went, but the kept ones
    out = io.StringIO()
    call_command("retention", "audit", "verify", stdout=out)
    assert "intact" in out.getvalue()


def test_grants_check_names_any_write_on_decisions_granted_to_a_login_but_the_webs(logins):
    """A fresh install's logins pass `grants check`; a write on a decision's table granted to
    the worker, operator or monitor login fails it, named."""
    for kind, (role, _) in logins.items():
        out = io.StringIO()
        call_command("retention", "grants", "check", f"--{kind}", role, "--target", TARGET,
                     stdout=out)  # fmt: skip
        assert "exactly what it needs" in out.getvalue()
    writes = (
        ("UPDATE", "retention_policyversion"),
        ("UPDATE", "retention_legalhold"),
        ("INSERT", "signatures_signature"),
        ("INSERT", "auth_user_groups"),
        ("INSERT", "django_q_ormq"),
    )
    for kind in ("operator", "monitor", "worker"):
        role = logins[kind][0]
        with connection.cursor() as cur:
            for privilege, table in writes:
                cur.execute(
                    sql.SQL("GRANT {} ON {} TO {}")
                    .format(sql.SQL(privilege), sql.Identifier(table), sql.Identifier(role))
                    .as_string(cur.connection)
                )
        out = io.StringIO()
        with pytest.raises(CommandError):
            call_command("retention", "grants", "check", f"--{kind}", role, "--target", TARGET,
                         stdout=out)  # fmt: skip
        for privilege, table in writes:
            if kind == "worker" and table == "django_q_ormq":
                continue  # the worker re-enqueues its leases
            assert f"beyond: {privilege} on retention_runner.{table}" in out.getvalue(), kind


def _forged_message(task_id: str, func: str, *args) -> str:
    return SignedPackage.dumps(
        {
            "id": task_id,
            "name": "forged",
            "func": func,
            "args": args,
            "kwargs": {},
            "started": timezone.now(),
        }  # fmt: skip
    )


class Gadget:
    """Unpickling this runs ``os.mkdir``: code execution at load time, whatever ``func`` says."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.mark.processes
def test_only_web_and_worker_enqueue_and_a_cluster_refuses_a_signed_task_the_product_did_not_make(
    logins, tmp_path
):
    """Finding 2: the operator and monitor logins cannot queue anything; the worker login can
    (its leases re-enqueue themselves), so a real cleanup cluster — connected as the worker
    login — refuses messages signed with the right SECRET_KEY that name another callable, carry
    a hook or hold a pickle gadget, and still runs the product's own tasks."""
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    from tests.runs.processes import kill_group, spawn, task_outcomes, wait_for
    from tests.security.roles import url_as

    for kind in ("operator", "monitor"):
        with connect_as(*logins[kind]) as conn:
            assert refused(
                conn, "INSERT INTO django_q_ormq (key, payload) VALUES ('cleanup', 'x')"
            ), kind
    ran = [tmp_path / name for name in ("func-ran", "gadget-ran")]
    task_ids = [uuid.uuid4().hex for _ in range(3)]
    forged = [
        # another callable
        _forged_message(task_ids[0], "os.mkdir", str(ran[0])),
        # the product's task with a hook (called with the task after it ran)
        SignedPackage.dumps(
            {
                "id": task_ids[1],
                "name": "hooked",
                "func": "runs.tasks.reconcile",
                "args": (),
                "kwargs": {},
                "hook": "os.getcwd",
                "started": timezone.now(),
            }
        ),  # fmt: skip
        # the product's task with a pickle gadget among its arguments
        SignedPackage.dumps(
            {
                "id": task_ids[2],
                "name": "gadget",
                "func": "runs.tasks.reconcile",
                "args": (Gadget(str(ran[1])),),
                "kwargs": {},
                "started": timezone.now(),
            }
        ),  # fmt: skip
    ]
    assert pickle.loads(pickle.dumps(Gadget(str(tmp_path / "probe")))) is None  # it does run
    assert (tmp_path / "probe").is_dir()
    with connect_as(*logins["worker"]) as conn:  # the worker login may queue: it does
        ids = [
            conn.execute(
                "INSERT INTO django_q_ormq (key, payload, lock) VALUES ('cleanup', %s, now())"
                " RETURNING id",
                [message],
            ).fetchone()[0]
            for message in forged
        ]
    genuine = async_task("runs.tasks.reconcile", cluster="cleanup")
    cluster = spawn(
        "qcluster", env={"DATABASE_URL": url_as(*logins["worker"]), "Q_CLUSTER_NAME": "cleanup"}
    )
    try:
        wait_for(
            lambda: (
                task_outcomes([genuine], "cleanup") and not OrmQ.objects.filter(pk__in=ids).exists()
            ),
            timeout=120,
            what="the genuine task to run and the forged ones to be failed",
        )
    finally:
        kill_group(cluster, signal.SIGTERM)
    assert task_outcomes([genuine], "cleanup")[genuine].success
    assert task_outcomes(task_ids, "cleanup") == {}  # none of them ran
    assert [path.exists() for path in ran] == [False, False]


def test_a_superuser_token_without_the_password_creates_no_one_and_grants_nothing(
    api, people, monkeypatch
):
    """Finding 3, first half: the superuser's API token alone — no password, or a wrong one —
    adds no person and changes no role, over the API and on the command line."""
    from core.models import ApiToken, OperatorAction
    from core.roles import roles_of

    vera = people["viewer"]
    for password in ("", "not-her-password"):
        status, error = api.post(
            "/users",
            {"username": "mallory", "password": "a long new password 42",
             "actor_password": password},
            as_="superuser",
        )  # fmt: skip
        assert (status, error["code"]) == (403, "password_required"), error
        for change in ("grant", "revoke"):
            status, error = api.post(
                f"/roles/{change}",
                {"username": "vera", "role": "compliance" if change == "grant" else "viewer",
                 "reason": "x", "password": password},
                as_="superuser",
            )  # fmt: skip
            assert (status, error["code"]) == (403, "password_required"), error
    # the command line with the token, no terminal and no password
    secret = ApiToken.PREFIX + "only-the-token"
    ApiToken.objects.create(user=people["superuser"], name="cli", prefix=secret[:12],
                            digest=ApiToken.digest_of(secret))  # fmt: skip
    monkeypatch.setenv("RETENTION_TOKEN", secret)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandError, match="password again"):
        call_command("retention", "role", "grant", "vera", "compliance", stdout=io.StringIO())
    with pytest.raises(CommandError, match="wrong"):
        monkeypatch.setattr("sys.stdin", io.StringIO("guess\n"))
        call_command("retention", "role", "grant", "vera", "compliance", "--password-stdin",
                     stdout=io.StringIO())  # fmt: skip
    # nor the admin's forms (a session alone)
    page = Client()
    page.force_login(people["superuser"])
    assert page.get("/admin/auth/user/add/", secure=True).status_code == 403
    page.post(f"/admin/auth/user/{vera.pk}/password/",
              {"password1": "a long new password 42", "password2": "a long new password 42"},
              secure=True)  # fmt: skip
    assert User.objects.get(pk=vera.pk).check_password("vera-pw")
    assert not User.objects.filter(username="mallory").exists()
    assert roles_of(User.objects.get(pk=vera.pk)) == {"viewer"}
    assert not OperatorAction.objects.filter(action__in=("user.create", "role.grant",
                                                          "role.revoke")).exists()  # fmt: skip


def test_a_compliance_grant_confirmed_by_one_superuser_alone_cannot_approve(
    api, people, events, make_user
):
    """Finding 3, second half: with her password, one superuser makes two people and grants
    both compliance; one submits a 1-day retention, the other cannot approve it until a second
    superuser confirms her grant (and the first superuser cannot confirm her own)."""

    from core.tokens import create_token

    sue = people["superuser"]
    for name in ("mallory", "trudy"):
        status, body = api.post(
            "/users",
            {"username": name, "password": f"{name}-password-1234", "actor_password": "sue-pw"},
            as_="superuser",
        )
        assert status == 200, body
        status, body = api.post(
            "/roles/grant",
            {"username": name, "role": "compliance", "reason": "new", "password": "sue-pw"},
            as_="superuser",
        )
        assert status == 200, body
    mallory, trudy = User.objects.get(username="mallory"), User.objects.get(username="trudy")
    api.tokens["trudy"] = create_token(trudy, name="api")[1]
    version = actions.apply_spec(
        PolicySpec.parse(events_spec(retention="1 day", name="Events older than 1 day")),
        author=mallory,
    )
    version = actions.submit_version(version, actor=mallory, reason="shorter")
    approve = f"/policies/events/versions/{version.number}/approve"
    status, error = api.post(
        approve, {"reason": "fine", "password": "trudy-password-1234"}, as_="trudy"
    )
    assert status >= 400 and "awaits a second superuser" in error["message"], error
    assert PolicyVersion.objects.get(pk=version.pk).state == PolicyVersion.State.SUBMITTED
    # the approvals page says so, and offers her no decision
    page = Client()
    page.force_login(trudy)
    html = page.get(reverse("retention:approvals"), secure=True).content.decode()
    assert "awaits a second superuser" in html
    # the same superuser again is no second superuser
    status, error = api.post(
        "/roles/grant",
        {"username": "trudy", "role": "compliance", "reason": "sure", "password": "sue-pw"},
        as_="superuser",
    )
    assert status >= 400 and "cannot confirm it" in error["message"], error
    # a second superuser confirms: now trudy approves
    sam = User.objects.create_superuser("sam", password="sam-pw")
    api.tokens["sam"] = create_token(sam, name="api")[1]
    status, body = api.post(
        "/roles/grant",
        {"username": "trudy", "role": "compliance", "reason": "checked", "password": "sam-pw"},
        as_="sam",
    )
    assert status == 200, body
    status, body = api.post(
        approve, {"reason": "fine", "password": "trudy-password-1234"}, as_="trudy"
    )
    assert status == 200, body
    assert PolicyVersion.objects.get(pk=version.pk).state == PolicyVersion.State.APPROVED
    assert sue.pk != sam.pk


def test_a_process_without_the_signing_key_decides_nothing(events_policy, make_user, settings):
    """A worker or operator host holds only the public key: a decision made there (the command
    line acting as a person) is refused with one line and writes nothing; it still verifies."""
    carol, dave = make_user("carol", "compliance"), make_user("dave", "compliance")
    version = actions.apply_spec(
        PolicySpec.parse(events_spec(retention="30 days", name="Events older than 30 days")),
        author=carol,
    )
    version = actions.submit_version(version, actor=carol, reason="longer")
    settings.RETENTION_SIGNING_KEY = None
    with pytest.raises(ActionError, match="no decision-signing key"):
        actions.approve_version(version, actor=dave, reason="fine")
    assert PolicyVersion.objects.get(pk=version.pk).state == PolicyVersion.State.SUBMITTED
    assert decisions.approval_refusal(events_policy.approved_version) == ""


def test_the_keys_are_read_as_ed25519_and_a_bad_one_is_named():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from signatures import keys

    private = Ed25519PrivateKey.generate()
    signing = keys.private_text(private).encode()
    verify = keys.public_text(private.public_key()).encode()
    got_private, got_public = keys.configured(signing, None, demo=False)
    assert keys.public_text(got_public) == verify.decode()
    assert keys.configured(None, verify, demo=False)[0] is None  # verifies, cannot sign
    assert keys.configured(None, None, demo=False) == (None, None)
    assert keys.configured(None, None, demo=True)[0] is not None  # the public demo key
    with pytest.raises(keys.BadKey, match="RETENTION_VERIFY_KEY"):
        keys.configured(None, b"not-a-key", demo=False)
    other = keys.public_text(Ed25519PrivateKey.generate().public_key()).encode()
    with pytest.raises(keys.BadKey, match="not the private half"):
        keys.configured(signing, other, demo=False)
