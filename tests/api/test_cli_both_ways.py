"""Every command of the command line run both ways — ``manage.py retention`` with the
database, and ``retention`` as a client of a live gunicorn with only a URL and a token — and
the outputs agree: what it prints, what it refuses, its exit status."""

from __future__ import annotations

import difflib
import re
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from core.models import OperatorAction
from core.tokens import create_token
from retention import actions
from retention.spec import PolicySpec
from runs.actions import trigger_run
from runs.engine import planner
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, create_events

from .live import gunicorn, with_api, with_database

# the server's log lines (django-q's "Enqueued …"): a command run with the database writes
# them to its own stderr, the server to its log; they are not the command's output
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ .*\n", re.M)
# a time relative to now ("(in 3h 24m)"): two commands a few seconds apart may straddle a minute
FROM_NOW = re.compile(r"\(in [0-9dhms ]+\)")


def output(result) -> tuple[str, str]:
    return FROM_NOW.sub("(in …)", result.stdout), LOG_LINE.sub("", result.stderr)


pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with gunicorn() as url:
        yield url


@pytest.fixture
def setting(make_user, tmp_path):
    create_events(3000)
    policy = approved_policy(make_user, **events_spec())
    author = User.objects.get(username="author-events")
    v2 = actions.apply_spec(PolicySpec.parse(events_spec(retention="25 days")), author=author)
    actions.submit_version(v2, actor=author, reason="longer")
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    hold = actions.place_hold(actor=author, reason="LIT-1", policy=policy, tenant="3")
    people = {
        "viewer": make_user("vera", "viewer"),
        "oncall": make_user("oscar", "oncall"),
        "auditor": make_user("audrey", "auditor"),
        "compliance": make_user("carla", "compliance"),
        "author": author,
    }
    folder = tmp_path / "policies"
    folder.mkdir()
    shutil.copy(Path(__file__).with_name("events.toml"), folder / "events.toml")
    return {
        "run": run.run_key,
        "hold": str(hold.pk),
        "dir": str(folder),
        "tokens": {role: create_token(user, name="both ways")[1] for role, user in people.items()},
    }


def test_every_command_prints_the_same_both_ways(server, setting):
    run, hold, tokens = setting["run"], setting["hold"], setting["tokens"]
    compared = []

    def both(role: str, *args: str, mask: str | None = None):
        """``mask``: a pattern for what differs between any two runs (a measured duration)."""
        a = with_database(args, token=tokens[role])
        b = with_api(args, url=server, token=tokens[role])

        def seen(result):
            text = output(result)
            return (result.returncode, *(re.sub(mask, "…", t) if mask else t for t in text))

        diff = "\n".join(
            difflib.unified_diff(
                *(("\n".join(map(str, seen(r)))).splitlines() for r in (a, b)),
                "database",
                "api",
                lineterm="",
            )
        )
        assert seen(a) == seen(b), f"{args}:\n{diff}"
        compared.append(args)
        return a

    def pair(role: str, do: tuple, undo: tuple) -> None:
        """do and undo with the database, then with the API: the same text each time."""
        done_db = with_database(do, token=tokens[role])
        undone_api = with_api(undo, url=server, token=tokens[role])
        done_api = with_api(do, url=server, token=tokens[role])
        undone_db = with_database(undo, token=tokens[role])
        for x, y in ((done_db, done_api), (undone_db, undone_api)):
            assert x.returncode == 0, x.stderr
            assert output(x) == output(y), (do, undo)
        compared.extend([do, undo])

    # reading
    assert both("viewer", "policy", "list").stdout.startswith("events  approved v1  latest v2")
    assert "eligible" in both("compliance", "policy", "preview", "events").stdout
    both(
        "compliance",
        "policy",
        "preview",
        "events",
        "--json",
        mask=r'"(duration_ms|taken_at)": [^,]+',
    )
    assert f"#{hold}" in both("viewer", "hold", "list").stdout
    both("viewer", "hold", "list", "--all")
    both("viewer", "role", "list")
    assert both("auditor", "audit", "verify").stdout.startswith("audit chain intact")
    assert "every invariant holds" in both("auditor", "check", run).stdout
    plan = both("compliance", "policy", "plan", setting["dir"])
    assert plan.returncode == 2 and "retention: 20 days -> 30 days" in plan.stdout

    # deciding, and undoing
    pair("oncall", ("pause", run, "--reason", "INC-7"), ("resume", run, "--reason", "INC-7 over"))
    pair("oncall", ("policy", "pause", "events", "--reason", "INC-8"),
         ("policy", "resume", "events", "--reason", "INC-8 over"))  # fmt: skip
    pair("oncall", ("policy", "disable", "events", "--reason", "freeze"),
         ("policy", "enable", "events", "--reason", "thaw"))  # fmt: skip
    pair("oncall", ("kill-switch", "on", "--reason", "INC-9"),
         ("kill-switch", "off", "--reason", "INC-9 over"))  # fmt: skip
    pair("compliance", ("hold", "release", hold, "--reason", "case closed"),
         ("hold", "withdraw-release", hold, "--reason", "not yet"))  # fmt: skip
    # the period's run made once; then both ways find it, and say so
    assert with_database(("trigger", "events", "--period", "2026-11-30"),
                         token=tokens["oncall"]).returncode == 0  # fmt: skip
    again = both("oncall", "trigger", "events", "--period", "2026-11-30")
    assert again.stdout.strip() and "already exists: the run of this period, v1" in again.stderr
    # the second submission of the same content makes no new version: the same text
    toml = str(Path(setting["dir"]) / "events.toml")
    assert (
        "events v3 submitted"
        in both("compliance", "policy", "apply", toml, "--reason", "30d").stdout
    )
    placed = both("compliance", "hold", "place", "--reason", "LIT-2", "--policy", "events",
                  "--tenant", "2", mask=r"#\d+")  # fmt: skip
    assert "placed: policy events, tenant 2" in placed.stdout
    # a floor requested and refused with the database, then with the API (one request of a
    # table waits at a time): the same text but for the floor's number
    number = re.compile(r"#\d+|approve \d+\)")
    ask = ("floor", "set", "public.rr_events", "10 days", "--mode", "governance", "--reason", "L")

    def way(run, args, role):
        result = run(args, token=tokens[role], **({"url": server} if run is with_api else {}))
        assert result.returncode == 0, result.stderr
        return result

    said = []
    for first, then in ((with_database, with_api), (with_api, with_database)):
        asked = way(first, ask, "compliance")
        floor = asked.stdout.split()[1].lstrip("#")
        refused = way(then, ("floor", "refuse", floor, "--reason", "no"), "author")
        said.append([number.sub("#…", t) for r in (asked, refused) for t in output(r)])
    assert said[0] == said[1]
    assert "requested on public.rr_events: 10 days, governance mode, by carla" in said[0][0]
    compared.extend([ask, ("floor", "refuse")])
    listed = both("viewer", "floor", "list").stdout
    assert "10 days, governance mode, set by carla [refused]" in listed

    # refusals
    assert (
        "another member of compliance must"
        in both("author", "policy", "reject", "events", "--version", "2", "--reason", "mine").stderr
    )
    assert (
        "requires one of the roles: oncall"
        in both("viewer", "pause", run, "--reason", "not mine to pause").stderr
    )
    assert "needs a reason" in both("oncall", "kill-switch", "on", "--reason", " ").stderr
    own = way(with_database, ask, "compliance").stdout.split()[1].lstrip("#")
    assert (
        "another member" in both("compliance", "floor", "approve", own, "--reason", "mine").stderr
    )
    assert "no run with key" in both("viewer", "status", "no-such-run").stderr
    assert (
        "--by oscar is not who is acting"
        in both("viewer", "kill-switch", "on", "--reason", "x", "--by", "oscar").stderr
    )

    # ending a run: once, then refused the same way twice
    assert (
        with_database(("cancel", run, "--reason", "done"), token=tokens["oncall"]).returncode == 0
    )
    assert both("oncall", "cancel", run, "--reason", "again").returncode == 1
    both("viewer", "status", run)
    both("viewer", "status", run, "--json")
    # a policy's period over every target (here the control database alone), as a file
    period = str(Path(setting["dir"]) / "period.manifest.json")
    day = NOW.date().isoformat()
    made = both("auditor", "evidence", "--policy", "events", "--period", day, "--manifest", period)
    assert f"{period}: the evidence manifest of events for " in made.stdout
    assert "over 1 target(s): 1 run(s)" in made.stdout

    rows = OperatorAction.objects.filter(action="run.pause")
    assert sorted(r.details.get("via") for r in rows) == ["api", "cli"]
    assert len(compared) == 35


def test_the_client_refuses_what_needs_the_database_and_plain_http_elsewhere(server, setting):
    token = setting["tokens"]["oncall"]
    for args in (("drain", "--until-idle"), ("reconcile",), ("explain", "events"),
                 ("grants", "check"), ("audit", "checkpoint"), ("token", "create")):  # fmt: skip
        result = with_api(args, url=server, token=token)
        assert result.returncode == 1 and result.stdout == ""
        assert re.match(r"CommandError: .*(on the server|dashboard)", result.stderr), result.stderr
    result = with_api(("check", setting["run"], "--shadow", "public.x"), url=server, token=token)
    assert "run it on the server" in result.stderr

    result = with_api(("status", setting["run"]), url="http://example.com:8000", token=token)
    assert result.returncode == 1
    assert "plain HTTP to another machine" in result.stderr
    for loopback in ("localhost", "[::1]"):
        url = server.replace("127.0.0.1", loopback)
        result = with_api(("policy", "list"), url=url, token=token)
        assert "plain HTTP" not in result.stderr


def test_approving_as_a_client_asks_for_the_password_again(server, setting):
    token = setting["tokens"]["compliance"]
    args = ("policy", "approve", "events", "--version", "2", "--reason", "reviewed")

    no_terminal = with_api(args, url=server, token=token)
    wrong = with_api((*args, "--password-stdin"), url=server, token=token, stdin="nope\n")
    right = with_api((*args, "--password-stdin"), url=server, token=token, stdin="carla-pw\n")

    assert no_terminal.returncode == 1
    assert "asks for your password again: run at a terminal or use --password-stdin" in (
        no_terminal.stderr
    )
    assert (wrong.returncode, wrong.stderr) == (
        1, "CommandError: wrong password: the approval of events v2 was not done\n",
    )  # fmt: skip
    assert right.returncode == 0, right.stderr
    assert right.stdout.startswith("events v2 approved by carla ")


def test_the_other_deciding_commands_print_the_same_both_ways(server, setting, make_user):
    """The commands that decide once per target — a release's second person, dead letters, a
    held run's confirmation, people and roles — each run with the database on one target and
    as a client on a twin: the same text but for the target's name."""
    from django.contrib.auth.models import Group
    from django.db import connection

    from runs.models import Run
    from tests.dashboard.conftest import make_dead_letter

    tokens = dict(setting["tokens"])
    root = User.objects.create_superuser("rooty", "rooty@example.com", "rooty-pw")
    root.groups.add(Group.objects.get_or_create(name="compliance")[0])
    tokens["root"] = create_token(root, name="both ways")[1]
    author = User.objects.get(username="author-events")
    holds = [setting["hold"]]
    events = Run.objects.get(run_key=setting["run"]).policy  # the first hold's policy
    holds.append(
        str(actions.place_hold(actor=author, reason="LIT-3", policy=events, tenant="4").pk)
    )
    letters = [str(make_dead_letter(make_user, slug=f"gone{i}", rows=200).pk) for i in range(4)]
    confirmed = []
    for i in range(2):
        create_events(200, name=f"rr_held{i}")
        policy = approved_policy(make_user, **events_spec(slug=f"held{i}", table=f"rr_held{i}"))
        run, _ = trigger_run(policy, tick=NOW)
        Run.objects.filter(pk=run.pk).update(state=Run.State.CONFIRM, state_reason="blast radius")
        confirmed.append(run.run_key)
    connection.close()  # the commands' own processes write from here on
    compared = []

    def twins(role: str, make_args, targets, mask: str, stdin=(None, None), client=()) -> str:
        """``make_args(target)`` with the database on the first target, as a client on the
        second (with ``client``'s arguments too); the outputs equal once ``mask`` hides what
        names the target."""
        a = with_database(make_args(targets[0]), token=tokens[role], stdin=stdin[0])
        b = with_api((*make_args(targets[1]), *client), url=server, token=tokens[role],
                     stdin=stdin[1])  # fmt: skip
        seen = [(r.returncode, *(re.sub(mask, "…", t) for t in output(r))) for r in (a, b)]
        assert seen[0] == seen[1], (make_args(targets[0]), seen)
        assert a.returncode == 0, a.stderr
        compared.append(make_args(targets[0])[:2])
        return a.stdout

    hold_id = r"#?\b\d+\b"
    for h in holds:  # one compliance officer asks, the other refuses, asks again, approves
        assert with_database(("hold", "release", h, "--reason", "settled"),
                             token=tokens["author"]).returncode == 0  # fmt: skip
    twins("compliance", lambda h: ("hold", "refuse-release", h, "--reason", "not yet"),
          holds, hold_id)  # fmt: skip
    twins("author", lambda h: ("hold", "release", h, "--reason", "settled now"), holds, hold_id)
    # (the client asks for the approver's password, as the page does)
    assert "released" in twins(  # the two commands run seconds apart: "(in 5h 37m)" may tick
        "compliance", lambda h: ("hold", "approve-release", h, "--reason", "agreed"),
        holds, hold_id + r"|\(in [^)]+\)", stdin=(None, "carla-pw\n"),
        client=("--password-stdin",),
    )  # fmt: skip
    letter = r"#\d+"
    assert "replayed" in twins("oncall", lambda d: ("replay", d, "--reason", "table back"),
                               letters[:2], letter)  # fmt: skip
    assert "discarded" in twins("oncall", lambda d: ("discard", d, "--reason", "gone for good"),
                                letters[2:], letter)  # fmt: skip
    twins("oncall", lambda k: ("confirm", k, "--reason", "expected size"), confirmed,
          r"held\d")  # fmt: skip
    # people and roles: the new person's password, then the superuser's own, asked again
    again = ("a-long-password-1234\nrooty-pw\n",) * 2
    twins("root", lambda u: ("user", "add", u, "--password-stdin"), ["newbie1", "newbie2"],
          r"newbie\d", stdin=again)  # fmt: skip
    twins("root", lambda u: ("role", "grant", u, "auditor", "--reason", "audit week",
                             "--password-stdin"),
          ["newbie1", "newbie2"], r"newbie\d", stdin=("rooty-pw\n",) * 2)  # fmt: skip
    twins("root", lambda u: ("role", "revoke", u, "auditor", "--reason", "audit over",
                             "--password-stdin"),
          ["newbie1", "newbie2"], r"newbie\d", stdin=("rooty-pw\n",) * 2)  # fmt: skip
    assert Run.objects.filter(run_key__in=confirmed, state=Run.State.CONFIRM).count() == 0
    assert User.objects.filter(username__in=["newbie1", "newbie2"]).count() == 2
    assert len(compared) == 9
