"""Every state-changing CLI command × every role: allowed or refused, decided by the action
itself (the command line has no view in front of it), like the URL × role matrix of
``tests/dashboard/test_authorization.py``.

The matrix must stay complete: ``test_every_state_changing_command_has_a_row`` walks the
``retention`` command's parsers and fails for a command that acts as a person without a
row here. A refused command gets one error naming the role it needs and changes nothing
(no operator-log row, the state as it was); an allowed one writes its operator-log row in
the caller's name."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from core.models import OperatorAction
from retention import actions as policy_actions
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion, RetentionFloor
from retention.spec import PolicySpec
from runs import actions as run_actions
from runs.actions import trigger_run
from runs.management.commands.retention import Command
from runs.models import DeadLetter, Run
from tests.conftest import create_user, fresh
from tests.dashboard.conftest import make_dead_letter
from tests.factories import approved_policy, events_spec
from tests.retention.conftest import create_events_table, policy_toml
from tests.runs.conftest import NOW, create_events

ROLES = ("compliance", "oncall", "auditor", "viewer", "superuser")
USERS = {
    "compliance": "carla",
    "oncall": "oscar",
    "auditor": "audrey",
    "viewer": "vera",
    "superuser": "root",
}
COMPLIANCE = {"compliance", "superuser"}
ONCALL = {"oncall", "superuser"}
ROLE_MANAGERS = {"superuser"}  # core.accounts.check_manager: people and roles are a superuser's
EVERYONE = set(ROLES)
PASSWORD = "plum-ladder-orbit-41"


@dataclass
class World:
    make_user: object
    tmp_path: object
    people: dict
    letter: DeadLetter  # a dead letter of a run whose table is gone
    archived_run_key: str  # a drained run whose policy archived its rows

    @property
    def policy(self) -> Policy:
        return Policy.objects.get(slug="events")

    def oncall(self) -> User:
        return User.objects.get_or_create(username="olga-oncall")[0]

    def active_run(self) -> Run:
        run, _ = trigger_run(self.policy, tick=NOW)
        assert run.state == Run.State.ACTIVE, run.state_reason
        return run


def submitted_version(world: World) -> list[str]:
    author = User.objects.get(username="author-events")
    spec = PolicySpec.parse(events_spec(retention="30 days"))
    version = policy_actions.apply_spec(spec, author=author)
    policy_actions.submit_version(version, actor=author, reason="shorter")
    return ["events", "--version", str(version.number)]


def held_run(world: World) -> Run:
    """A run held for confirmation: far more old rows than the approved preview counted."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO public.rr_events SELECT 1000000 + g, 2, %s, 'closed', 'x'"
            " FROM generate_series(1, 20000) AS g",
            [NOW - timedelta(days=60)],
        )
    run, _ = trigger_run(world.policy, tick=NOW)
    assert run.state == Run.State.CONFIRM, run.state_reason
    return run


def paused_run(world: World) -> Run:
    run = world.active_run()
    oncall = world.make_user("olga", "oncall")
    return run_actions.pause_run(run, actor=oncall, reason="before the test")


def policy_file(world: World) -> list[str]:
    path = world.tmp_path / "t_events.toml"
    path.write_text(policy_toml(slug='"t-events"'), encoding="utf-8")
    return [str(path), "--reason", "new policy"]


def disabled_policy(world: World) -> list[str]:
    oncall = world.make_user("olga", "oncall")
    policy_actions.set_policy_enabled(world.policy, False, actor=oncall, reason="before")
    return ["events", "--reason", "back on"]


def paused_policy(world: World) -> list[str]:
    oncall = world.make_user("olga", "oncall")
    policy_actions.pause_policy(world.policy, actor=oncall, reason="before")
    return ["events", "--reason", "over"]


def active_hold(world: World) -> list[str]:
    officer = world.make_user("cora", "compliance")
    hold = policy_actions.place_hold(actor=officer, reason="case 9", tenant="3")
    return [str(hold.pk), "--reason", "case closed"]


def requested_hold(world: World, requester: str) -> list[str]:
    """A hold whose release ``requester`` (a compliance officer) asked for."""
    args = active_hold(world)
    officer = User.objects.filter(username=requester).first() or world.make_user(
        requester, "compliance"
    )
    hold = LegalHold.objects.get(pk=args[0])
    policy_actions.request_hold_release(hold, actor=officer, reason="settled")
    return args


def withdrawable_hold(world: World) -> list[str]:
    """A release request by the compliance officer of the matrix: only she withdraws it (a
    superuser is another person: refused as not the requester, below)."""
    return requested_hold(world, USERS["compliance"])


def requested_floor(world: World) -> list[str]:
    officer = User.objects.filter(username="cora").first() or world.make_user("cora", "compliance")
    floor = policy_actions.request_floor(
        "public.rr_events", "10 days", mode="compliance", actor=officer, reason="statute"
    )
    return [str(floor.pk), "--reason", "checked"]


def kill_switch_on(world: World) -> list[str]:
    oncall = world.make_user("olga", "oncall")
    run_actions.set_kill_switch(True, actor=oncall, reason="before")
    return ["off", "--reason", "over"]


def drained_archive_run(make_user, directory) -> str:
    """A drained run whose policy archives its rows (under ``directory``) before deleting them:
    what a restore asks to put back."""
    from runs.engine import worker
    from tests.archive.conftest import create_typed, typed_spec

    create_typed()
    policy = approved_policy(make_user, **typed_spec(directory))
    run, _ = trigger_run(policy, tick=NOW)
    worker.drain(run.pk, budget_s=120)
    return run.run_key


def second_target(world: World) -> list[str]:
    """The test database itself, as a second target's connection string."""
    import os

    from tests.runs.conftest import worker_env

    os.environ["RR_MATRIX_DSN"] = worker_env()["DATABASE_URL"]
    return ["second", "--dsn-env", "RR_MATRIX_DSN"]


def registered_target(world: World) -> list[str]:
    from targets.models import Target

    Target.objects.create(name="second", dsn_env="RR_MATRIX_DSN", created_by="setup")
    return ["second", "--reason", "decommissioned"]


def newcomer(world: World, *roles: str) -> User:
    return world.make_user("newbie", *roles)


# command: (what to prepare, returning the arguments after the command's words;
#           the roles allowed; the operator-log action an allowed call writes)
MATRIX = {
    "policy apply": (policy_file, COMPLIANCE, "version.submit"),
    "policy approve": (
        lambda w: [*submitted_version(w), "--reason", "reviewed"],
        COMPLIANCE,
        "version.approve",
    ),
    "policy reject": (
        lambda w: [*submitted_version(w), "--reason", "not now"],
        COMPLIANCE,
        "version.reject",
    ),
    "policy enable": (disabled_policy, ONCALL, "policy.enable"),
    "policy disable": (lambda w: ["events", "--reason", "off"], ONCALL, "policy.disable"),
    "policy pause": (lambda w: ["events", "--reason", "INC-3"], ONCALL, "policy.pause"),
    "policy resume": (paused_policy, ONCALL, "policy.resume"),
    "hold place": (lambda w: ["--reason", "subpoena", "--tenant", "3"], COMPLIANCE, "hold.place"),
    "hold release": (active_hold, COMPLIANCE, "hold.release_request"),
    "hold approve-release": (lambda w: requested_hold(w, "cora"), COMPLIANCE, "hold.release"),
    "hold withdraw-release": (withdrawable_hold, {"compliance"}, "hold.release_withdraw"),
    "hold refuse-release": (
        lambda w: requested_hold(w, "cora"),
        COMPLIANCE,
        "hold.release_refuse",
    ),
    "floor set": (
        lambda w: ["public.rr_events", "10 days", "--mode", "compliance", "--reason", "statute"],
        COMPLIANCE,
        "floor.request",
    ),
    "floor approve": (requested_floor, COMPLIANCE, "floor.approve"),
    "floor refuse": (requested_floor, COMPLIANCE, "floor.refuse"),
    "trigger": (lambda w: ["events", "--period", "2026-11-29"], ONCALL, "run.trigger"),
    "pause": (lambda w: [w.active_run().run_key, "--reason", "x"], ONCALL, "run.pause"),
    "resume": (lambda w: [paused_run(w).run_key, "--reason", "x"], ONCALL, "run.resume"),
    "cancel": (lambda w: [w.active_run().run_key, "--reason", "x"], ONCALL, "run.cancel"),
    "confirm": (lambda w: [held_run(w).run_key, "--reason", "x"], ONCALL, "run.confirm"),
    "replay": (lambda w: [str(w.letter.pk), "--reason", "x"], ONCALL, "dead_letter.replay"),
    "discard": (lambda w: [str(w.letter.pk), "--reason", "x"], ONCALL, "dead_letter.discard"),
    "retry": (lambda w: [w.letter.run.run_key, "--reason", "fixed"], ONCALL, "run.retry"),
    "restore": (
        lambda w: [w.archived_run_key, "--tenant", "2", "--reason", "deleted by mistake"],
        COMPLIANCE,
        "restore.request",
    ),
    "target add": (second_target, ONCALL, "target.add"),
    "target remove": (registered_target, ONCALL, "target.remove"),
    "kill-switch on": (lambda w: ["--reason", "incident"], ONCALL, "kill_switch.on"),
    "kill-switch off": (lambda w: kill_switch_on(w)[1:], ONCALL, "kill_switch.off"),
    "role grant": (
        lambda w: [newcomer(w).username, "viewer", "--reason", "joins", "--password-stdin"],
        ROLE_MANAGERS,
        "role.grant",
    ),
    "role revoke": (
        lambda w: [
            newcomer(w, "viewer").username,
            "viewer",
            "--reason",
            "leaves",
            "--password-stdin",
        ],
        ROLE_MANAGERS,
        "role.revoke",
    ),
    "user add": (lambda w: ["newbie", "--password-stdin"], ROLE_MANAGERS, "user.create"),
    # for oneself, with one's own password: anyone holding a role
    "token create": (lambda w: ["--password-stdin"], EVERYONE, "token.create"),
}
# Refusals that are not about the role: a superuser holds every role but is another person.
NOT_THE_ROLE = {
    ("hold withdraw-release", "superuser"): (f"only {USERS['compliance']}, who requested it",),
}
# Commands that act as the system, as the clusters do, or only read (docs/security.md).
SYSTEM_OR_READ = {
    "status", "drain", "reconcile", "explain", "startup", "audit verify", "audit checkpoint",
    "check", "policy preview", "policy list", "policy plan", "hold list", "role list",
    "floor list", "runs", "dead-letters", "evidence", "policy show", "policy pull", "target list",
    # a target's ledger: run with the target's owner login, as migrate is
    "target migrate",
    # the database's logins and grants: run with the owner's login, not as a person
    "grants apply", "grants check", "grants sql",
}  # fmt: skip


def command_words() -> set[str]:
    parser = Command().create_parser("manage.py", "retention")
    words = set()

    def walk(p, prefix):
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            words.add(" ".join(prefix))
            return
        for name, child in subs[0].choices.items():
            walk(child, [*prefix, name])

    walk(parser, [])
    return words


def test_every_state_changing_command_has_a_row():
    words = command_words()
    # kill-switch takes its state as an argument: one row per state
    listed = {w.replace("kill-switch on", "kill-switch").replace("kill-switch off", "kill-switch")
              for w in MATRIX}  # fmt: skip
    missing = sorted(words - listed - SYSTEM_OR_READ)
    assert not missing, f"add these commands to the CLI role matrix: {missing}"
    stale = sorted((listed | SYSTEM_OR_READ) - words)
    assert not stale, f"these rows name no command any more: {stale}"


@pytest.fixture(scope="module")
def built(build_once, tmp_path_factory):
    """The tables, the approved policy ``events``, a person per role, a dead letter and a
    drained archiving run, once for the module (``tests.conftest.build_once``): each command
    runs in a savepoint rolled back after it."""
    directory = tmp_path_factory.mktemp("archive")

    def build():
        create_events_table()  # what ``policy apply`` files name
        create_events(600)
        approved_policy(create_user, **events_spec())
        people = {role: create_user(USERS[role], role) for role in ROLES if role != "superuser"}
        root = create_user(USERS["superuser"])
        root.is_superuser = True
        root.save()
        people["superuser"] = root
        return {
            "people": people,
            "letter": make_dead_letter(create_user),
            "archived_run_key": drained_archive_run(create_user, directory),
        }

    return build_once(build)


@pytest.fixture
def world(built, make_user, tmp_path):
    return World(make_user, tmp_path, **fresh(built))


def snapshot() -> tuple:
    """What a refused command must leave as it was."""
    return (
        OperatorAction.objects.count(),
        list(Run.objects.order_by("pk").values_list("pk", "state")),
        list(PolicyVersion.objects.order_by("pk").values_list("pk", "state")),
        list(Policy.objects.order_by("pk").values_list("pk", "enabled", "paused")),
        list(
            LegalHold.objects.order_by("pk").values_list(
                "pk", "released_at", "release_requested_at"
            )
        ),
        KillSwitch.is_on(),
        list(RetentionFloor.objects.order_by("pk").values_list("pk", "approved_at", "refused_at")),
        User.objects.count(),
        sorted(User.groups.through.objects.values_list("user_id", "group_id")),
    )


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("command", sorted(MATRIX))
def test_each_role_is_allowed_or_refused_each_command(world, command, role, act_as, monkeypatch):
    prepare, allowed, action = MATRIX[command]
    user = world.people[role]
    args = [*command.split(), *prepare(world)]
    if command == "token create":
        args[2:2] = ["--username", user.username]
        user.set_password(PASSWORD)
        user.save()
    else:
        act_as(user)
    if command in ("role grant", "role revoke", "user add"):
        # people and roles ask for the actor's password again (after the new person's)
        user.set_password(PASSWORD)
        user.save()
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n" + PASSWORD + "\n"))
    before = snapshot()
    newest = OperatorAction.objects.order_by("-chain_seq").values_list("chain_seq", flat=True)
    last = newest.first() or 0

    try:
        call_command("retention", *args, stdout=io.StringIO(), stderr=io.StringIO())
        refusal = None
    except CommandError as exc:
        refusal = str(exc)

    if role in allowed:
        assert refusal is None, refusal
        rows = OperatorAction.objects.filter(chain_seq__gt=last, action=action)
        assert list(rows.values_list("actor", flat=True)) == [user.username]
    else:
        assert refusal is not None, f"{command} ran for {role}"
        expected = NOT_THE_ROLE.get(
            (command, role), ("requires one of the roles", "may not manage people or roles")
        )
        assert any(text in refusal for text in expected), refusal
        assert snapshot() == before


@pytest.mark.parametrize(
    "control",
    [
        lambda run, **kw: run_actions.pause_run(run, **kw),
        lambda run, **kw: run_actions.cancel_run(run, **kw),
        lambda run, **kw: run_actions.set_kill_switch(True, **kw),
        lambda run, **kw: policy_actions.set_policy_enabled(run.policy, False, **kw),
        lambda run, reason, **kw: trigger_run(run.policy, tick=NOW - timedelta(days=1), **kw),
        lambda run, **kw: policy_actions.pause_policy(run.policy, **kw),
    ],
    ids=["pause", "cancel", "kill-switch", "disable", "trigger", "pause policy"],
)
def test_an_action_called_with_a_name_instead_of_a_person_is_refused(world, control):
    """Only the product's own processes (scheduler, reconciler, worker, guard, start-up) act
    under a name; any other name has no roles, so a caller that passed one by mistake (or a
    username) gets nothing done."""
    run = world.active_run()
    before = snapshot()
    with pytest.raises(PermissionDenied):
        control(run, actor="oscar", reason="a username is not a person")
    assert snapshot() == before
