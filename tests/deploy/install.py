"""A deployment the way docs/deploy.md describes it, on a new database: ``migrate``, a
superuser, users and roles from the command line, gunicorn and a cleanup qcluster as
real processes (DEBUG off, a real SECRET_KEY, behind a TLS proxy's header)."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlencode

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from signatures import keys
from tests import zygote

ROOT = Path(__file__).resolve().parents[2]
POLICY_TOML = """\
slug = "events"
name = "Events older than 20 days"
table = "public.rr_events"
key = "id"
timestamp = "occurred_at"
tenant = "tenant_id"
retention = "{retention}"
schedule = "0 3 * * *"
timezone = "UTC"
chunk_size = 100

[limits]
policy_workers = 2
tenant_workers = 1

# chunk timeouts that fit the short task timeout below (validation requires it)
[timeouts]
statement_ms = 3000
lock_ms = 500

[[keep]]
column = "status"
op = "="
value = "disputed"
"""


@contextmanager
def new_database(admin: dict):
    """A uniquely named, empty database on the server ``admin`` connects to; dropped after."""
    name = f"rr_deploy_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_url(admin: dict, name: str, login: tuple[str, str] | None = None) -> str:
    host, port, user = admin.get("host") or "", admin.get("port") or 5432, admin["user"]
    if login is not None:
        user = f"{login[0]}:{login[1]}"
    if host.startswith("/"):
        return f"postgresql://{user}@/{name}?host={host}&port={port}"
    return f"postgresql://{user}@{host}:{port}/{name}"


KINDS = ("web", "worker", "operator", "monitor")


@contextmanager
def logins(admin: dict):
    """One login per kind of process (docs/deploy.md, "Database logins"), uniquely named on
    the server ``admin`` connects to; dropped after (drop the databases they hold privileges
    in first)."""
    made = {
        kind: (f"rr_{kind}_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(16)) for kind in KINDS
    }
    with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
        for role, password in made.values():
            conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
    try:
        yield made
    finally:
        with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
            for role, _ in made.values():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


SIGNING_KEY = Ed25519PrivateKey.generate()


def production_env(url: str) -> dict:
    """DEBUG off, no demo mode, a real secret, behind a proxy that terminates TLS."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RETENTION_", "DJANGO_", "Q_CLUSTER")) and k not in {"DEBUG"}
    }
    env.update(
        DATABASE_URL=url,
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        # every host verifies decisions; only the web host signs them (env_of below)
        RETENTION_VERIFY_KEY=keys.public_text(SIGNING_KEY.public_key()),
        METRICS_TOKEN=secrets.token_urlsafe(24),
        SECURE_PROXY_SSL_HEADER="1",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        RETENTION_LEASE_BUDGET_S="5",
        RETENTION_Q_TIMEOUT="15",
        RETENTION_Q_RETRY="20",
    )
    return env


def manage(env: dict, *args: str, stdin: str | None = None, ok: bool = True):
    result = zygote.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        timeout=180,
    )
    if ok:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, (args, result.stderr)
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(env: dict, *cmd: str, extra: dict | None = None) -> subprocess.Popen:
    """A long-running process; its output goes to a file (a pipe nobody reads would block it
    once full), kept as ``proc.log`` for a failing test to show."""
    import tempfile

    log = tempfile.NamedTemporaryFile("w+", prefix="rr-deploy-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, *cmd],
        cwd=ROOT,
        env=dict(env, **(extra or {})),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    proc.log = log.name
    return proc


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the main PID (as systemd's KillMode=mixed does), then clean up the group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class Browser:
    """HTTP to gunicorn as the TLS proxy forwards it (X-Forwarded-Proto: https), keeping
    cookies itself (they are Secure, so a cookie jar would not send them over http)."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, data: dict | None = None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        head = {"Host": f"127.0.0.1:{self.port}", "X-Forwarded-Proto": "https", **(headers or {})}
        if self.cookies:
            head["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if data is not None:
            body = urlencode(data)
            head["Content-Type"] = "application/x-www-form-urlencoded"
            head["Origin"] = f"https://127.0.0.1:{self.port}"
        conn.request(method, path, body=body, headers=head)
        response = conn.getresponse()
        content = response.read().decode("utf-8", "replace")
        for key, value in response.getheaders():
            if key.lower() == "set-cookie":
                name, _, rest = value.partition("=")
                self.cookies[name] = rest.split(";", 1)[0]
        conn.close()
        return response.status, dict(response.getheaders()), content

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def sign_in(self, username: str, password: str) -> None:
        status, _, page = self.get("/login/")
        assert status == 200, page
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        status, headers, page = self.request(
            "POST",
            "/login/",
            {"username": username, "password": password, "csrfmiddlewaretoken": token},
        )
        assert status == 302, (status, page[:500])


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def create_events(url_params: dict, name: str, rows: int = 3000) -> None:
    """A target table in the new database: ids increase with age over 40 days; every 17th
    row is 'disputed' (kept by the policy)."""
    with psycopg.connect(**url_params, dbname=name, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.rr_events (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            " occurred_at timestamptz NOT NULL, status text)"
        )
        conn.execute(
            "INSERT INTO public.rr_events SELECT g, 1 + g %% 3,"
            " now() - make_interval(days => 40) * (1 - g::float8 / %s),"
            " CASE WHEN g %% 17 = 0 THEN 'disputed' ELSE 'closed' END"
            " FROM generate_series(1, %s) g",
            [rows, rows],
        )
        conn.execute("ANALYZE public.rr_events")


def remaining(admin: dict, name: str, cutoff: str) -> tuple[int, int]:
    """(rows under the run's cutoff that the policy does not keep, disputed rows) left in
    the new database's target table."""
    with psycopg.connect(**admin, dbname=name) as conn:
        return conn.execute(
            "SELECT count(*) FILTER (WHERE occurred_at < %s::timestamptz"
            " AND status <> 'disputed'), count(*) FILTER (WHERE status = 'disputed')"
            " FROM public.rr_events",
            [cutoff],
        ).fetchone()


def deploy_and_operate(admin: dict, tmp_path: Path, *, every_command: bool) -> dict:
    """The whole flow on a new database; returns what it observed for the caller to assert."""
    seen: dict = {"timings": []}
    clock = time.monotonic()

    def step(label: str) -> None:
        nonlocal clock
        seen["timings"].append((label, round(time.monotonic() - clock, 1)))
        clock = time.monotonic()

    with logins(admin) as made, new_database(admin) as name:
        # the owner runs migrate and the grants; every process then has a login of its own.
        # (Commands that follow one another with one login run in one process, each as
        # ``manage.py`` would run it: ``in_one_process``.)
        owner = production_env(database_url(admin, name))
        create_events(admin, name)  # the application's table, there before the product
        grants = [a for kind, (role, _) in made.items() for a in (f"--{kind}", role)]
        target = ["--target", "public.rr_events"]
        done = in_one_process(
            owner,
            [
                ("migrate", ["migrate", "--no-input", "-v", "0"], {}, None),
                ("grants apply", ["retention", "grants", "apply", *grants, *target], {}, None),
                ("grants check", ["retention", "grants", "check", *grants, *target], {}, None),
            ],
        )
        seen["grants"] = done["grants check"][1]
        step("migrate, logins: grants apply, grants check")
        env_of = {
            kind: dict(owner, DATABASE_URL=database_url(admin, name, login))
            for kind, login in made.items()
        }
        # the web host alone holds the decision-signing key: decisions are made there
        env_of["web"]["RETENTION_SIGNING_KEY"] = keys.private_text(SIGNING_KEY)
        web, worker, env = env_of["web"], env_of["worker"], env_of["operator"]
        # people and roles: superusers, on the web host, with the web login. The CLI acts as a
        # person: their personal token, obtained with their password (minted on the web host:
        # the operator login writes nothing). Commands that decide run there too, where the
        # decision-signing key is.
        root, second = "root-password-1234", "second-password-1234"

        def token(user: str, password: str) -> tuple:
            return (f"token {user}", ["retention", "token", "create", "--username", user,
                                      "--password-stdin"], {}, f"{password}\n")  # fmt: skip

        def as_(user: str) -> dict:
            return {"RETENTION_TOKEN": f"{{output:token {user}}}"}

        steps = [
            ("superuser root", ["createsuperuser", "--no-input", "--username", "root", "--email",
                                "root@example.com"], {"DJANGO_SUPERUSER_PASSWORD": root}, None),
            token("root", root),
        ]  # fmt: skip
        # (the new person's password, then root's own, asked again: a token alone adds no one)
        steps += [
            (f"user add {user}", ["retention", "user", "add", user, "--by", "root",
                                  "--password-stdin"], as_("root"),
             f"{user}-password-1234\n{root}\n")
            for user in ("alice", "carol", "oscar")
        ]  # fmt: skip
        # compliance makes an approver once a second superuser confirms the grant
        steps += [
            ("superuser second", ["createsuperuser", "--no-input", "--username", "second",
                                  "--email", "s@example.com"],
             {"DJANGO_SUPERUSER_PASSWORD": second}, None),
            token("second", second),
        ]  # fmt: skip
        steps += [
            (f"grant {user} by {who}", ["retention", "role", "grant", user, "compliance", "--by",
                                        who, "--reason", "first compliance officers",
                                        "--password-stdin"], as_(who), f"{password}\n")
            for user in ("alice", "carol")
            for who, password in (("root", root), ("second", second))
        ]  # fmt: skip
        steps += [
            token("alice", "alice-password-1234"),
            token("carol", "carol-password-1234"),
            ("grant oscar", ["retention", "role", "grant", "oscar", "oncall", "--by", "root",
                             "--password-stdin"], as_("root"), f"{root}\n"),
            token("oscar", "oscar-password-1234"),
        ]  # fmt: skip
        done = in_one_process(web, steps)
        as_root, as_alice, as_carol, as_oscar = (
            dict(web, RETENTION_TOKEN=done[f"token {user}"][1].strip())
            for user in ("root", "alice", "carol", "oscar")
        )
        # the operator login: the deployment checks, the people it reads
        done = in_one_process(
            env,
            [
                ("check --deploy", ["check", "--deploy", "--fail-level", "WARNING"], {}, None),
                ("role list", ["retention", "role", "list"], {}, None),
            ],
        )
        seen["roles"] = done["role list"][1]
        step("superuser, users, roles, check --deploy")

        policy = tmp_path / "events.toml"
        policy.write_text(POLICY_TOML.format(retention="20 days"))
        # on the web host, each as the person it names
        done = in_one_process(
            web,
            [
                ("apply", ["retention", "policy", "apply", str(policy), "--author", "alice",
                           "--reason", "ready for review"],
                 {"RETENTION_TOKEN": as_alice["RETENTION_TOKEN"]}, None),
                ("approve", ["retention", "policy", "approve", "events", "--version", "1",
                             "--approver", "carol", "--reason", "reviewed"],
                 {"RETENTION_TOKEN": as_carol["RETENTION_TOKEN"]}, None),
                ("trigger", ["retention", "trigger", "events", "--by", "oscar"],
                 {"RETENTION_TOKEN": as_oscar["RETENTION_TOKEN"]}, None),
            ],
        )  # fmt: skip
        seen["apply"] = done["apply"][1]
        run_key = done["trigger"][1].strip()
        seen["run_key"] = run_key
        step("policy apply/approve, trigger")

        port = free_port()
        gunicorn = start(
            web, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
            extra={"GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "2"},
        )  # fmt: skip
        cleanup = start(worker, "manage.py", "qcluster", extra={"Q_CLUSTER_NAME": "cleanup"})
        try:
            browser = Browser(port)

            def health():
                try:
                    status, _, body = browser.get("/healthz")
                except OSError:
                    return None
                return json.loads(body) if status == 200 else None

            try:
                seen["health"] = wait_for(
                    lambda: (h := health()) and h["clusters"] and h, timeout=90, what="healthz"
                )
            except AssertionError:
                for proc in (gunicorn, cleanup):
                    print(f"== {proc.args} {proc.poll()}\n" + Path(proc.log).read_text()[-4000:])
                raise
            step("gunicorn and qcluster up (healthz shows the cluster)")

            def state() -> str:
                with psycopg.connect(**admin, dbname=name) as conn:
                    return conn.execute(
                        "SELECT state FROM retention_runner.runs_run WHERE run_key = %s", [run_key]
                    ).fetchone()[0]

            wait_for(lambda: state() == "drained", timeout=150, what="the run to drain")
            out = manage(env, "retention", "status", run_key, "--json").stdout
            seen["status"] = json.loads(out)
            step("run drained by the cluster")
            seen["left"] = remaining(admin, name, seen["status"]["cutoff"])
            _, _, seen["metrics"] = browser.get(
                "/metrics", headers={"Authorization": f"Bearer {web['METRICS_TOKEN']}"}
            )
            seen["anonymous_metrics"] = browser.get("/metrics")[0]
            status, headers, _ = Browser(port).request(
                "GET", "/", headers={"X-Forwarded-Proto": "http"}
            )
            seen["plain_http"] = (status, headers.get("Location", ""))
            seen["static"] = browser.get("/static/css/app.css")[0]
            browser.sign_in("alice", "alice-password-1234")
            run_page = re.search(r'href="(/runs/\d+/)"', browser.get("/runs/")[2]).group(1)
            pages = ["/", "/policies/", "/policies/events/", "/policies/events/v1/",
                     "/policies/holds/", "/runs/", run_page, "/runs/audit/",
                     "/runs/dead-letters/", "/runs/activity/", "/runs/audit/export.csv",
                     "/metrics"]  # fmt: skip
            seen["pages"] = {page: browser.get(page)[0] for page in pages}
            admin_browser = Browser(port)
            admin_browser.sign_in("root", "root-password-1234")
            seen["admin"] = {
                page: admin_browser.get(page)[0]
                for page in ("/admin/", "/admin/auth/group/", "/admin/auth/user/")
            }
            step("metrics, pages, admin over HTTP")
        finally:
            stop(cleanup)
            stop(gunicorn)
        step("web and cluster stopped")
        done = in_one_process(
            env,
            [
                ("check", ["retention", "check", run_key], {}, None),
                ("verify", ["retention", "audit", "verify"], {}, None),
            ],
        )
        seen["check"], seen["verify"] = done["check"][1], done["verify"][1]
        if every_command:
            tokens = {
                name: e["RETENTION_TOKEN"]
                for name, e in (("alice", as_alice), ("carol", as_carol), ("oscar", as_oscar))
            }
            tokens["root"] = as_root["RETENTION_TOKEN"]
            seen["commands"] = every_other_command(env_of, run_key, tmp_path, tokens)
            step("every other command")
    return seen


def every_other_command(env_of: dict, run_key: str, tmp_path: Path, tokens: dict) -> dict:
    """Each remaining CLI command once, with the login that runs it in production: (return
    code, first line of output or error). A command naming a person (--author, --approver,
    --by) runs with that person's token."""
    v2 = tmp_path / "events-v2.toml"
    v2.write_text(POLICY_TOML.format(retention="30 days"))
    commands = {
        "policy list": ["retention", "policy", "list"],
        "policy preview": ["retention", "policy", "preview", "events"],
        "policy apply v2": ["retention", "policy", "apply", str(v2), "--author", "alice", "--reason", "ready for review"],
        "policy reject v2": ["retention", "policy", "reject", "events", "--version", "2",
                             "--approver", "carol", "--reason", "not now"],
        "hold place": ["retention", "hold", "place", "--by", "alice", "--reason", "litigation",
                       "--policy", "events", "--tenant", "2"],
        "hold list": ["retention", "hold", "list"],
        "hold release": ["retention", "hold", "release", "1", "--by", "carol", "--reason", "settled"],
        "kill-switch on": ["retention", "kill-switch", "on", "--by", "oscar", "--reason", "drill"],
        "kill-switch off": ["retention", "kill-switch", "off", "--by", "oscar", "--reason", "drill over"],
        "status": ["retention", "status", run_key],
        "pause": ["retention", "pause", run_key, "--by", "oscar", "--reason", "x"],
        "resume": ["retention", "resume", run_key, "--by", "oscar", "--reason", "x"],
        "cancel": ["retention", "cancel", run_key, "--by", "oscar", "--reason", "x"],
        "confirm": ["retention", "confirm", run_key, "--by", "oscar", "--reason", "x"],
        "replay": ["retention", "replay", "1", "--by", "oscar", "--reason", "x"],
        "discard": ["retention", "discard", "1", "--by", "oscar", "--reason", "x"],
    }  # fmt: skip
    # the system's commands run where the clusters run, with the worker login
    system = {
        "drain": ["retention", "drain", "--until-idle"],
        "reconcile": ["retention", "reconcile"],
        "explain": ["retention", "explain", "events"],
        "startup": ["retention", "startup"],
    }
    # people and roles: a superuser on the web host, with the web login
    people = {
        "role grant": ["retention", "role", "grant", "oscar", "auditor", "--by", "root",
                       "--password-stdin"],
        "role revoke": ["retention", "role", "revoke", "oscar", "auditor", "--by", "root",
                        "--reason", "left", "--password-stdin"],
    }  # fmt: skip
    # reading needs no more than the read-only operator login
    read = {label: commands.pop(label) for label in ("policy list", "hold list", "status")}
    results = {}
    # the superuser's password, asked again for people and roles
    again = dict.fromkeys(people, "root-password-1234\n")
    for kind, group in (
        ("operator", read),
        ("web", commands),
        ("worker", system),
        ("web", people),
    ):
        results.update(_run_commands(env_of[kind], group, tokens, again))
    return results


def in_one_process(env: dict, steps: list[tuple]) -> dict:
    """Commands one after another in one process with the environment ``env``, each as
    ``manage.py …`` would run it: ``(label, args, additions to the environment, stdin)``. An
    addition written ``{output:LABEL}`` is what an earlier command printed (a token it
    created). Each must succeed; label → (0, stdout, stderr). One process saves a Python and
    Django start-up per command: a new installation's people and roles are a dozen commands."""
    script = (
        "import io, json, os, sys, django; django.setup()\n"
        "from django.core.management import call_command\n"
        "out = {}\n"
        "for label, args, extra, stdin in json.loads(sys.stdin.read()):\n"
        "    before = {key: os.environ.get(key) for key in extra}\n"
        "    for key, value in extra.items():\n"
        "        if value.startswith('{output:'):\n"
        "            value = out[value[len('{output:'):-1]][1].strip()\n"
        "        os.environ[key] = value\n"
        "    sys.stdin = io.StringIO(stdin or '')\n"
        "    stdout, stderr = io.StringIO(), io.StringIO()\n"
        "    call_command(*args, stdout=stdout, stderr=stderr)\n"
        "    out[label] = [0, stdout.getvalue(), stderr.getvalue()]\n"
        "    for key, value in before.items():\n"
        "        os.environ.pop(key) if value is None else os.environ.update({key: value})\n"
        "print('RESULTS' + json.dumps(out))\n"
    )
    result = zygote.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(env, DJANGO_SETTINGS_MODULE="config.settings"),
        input=json.dumps(steps),
        timeout=300,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, (
        result.stdout[-3000:],
        result.stderr[-3000:],
    )
    return {k: tuple(v) for k, v in json.loads(result.stdout.split("RESULTS", 1)[1]).items()}


def _run_commands(env: dict, commands: dict, tokens: dict, stdin: dict | None = None) -> dict:
    # One process runs them all (each as `manage.py retention ...` would), to save start-ups.
    script = (
        "import io, json, sys, django; django.setup()\n"
        "from django.core.management import call_command\n"
        "from django.core.management.base import CommandError\n"
        "out = {}\n"
        "CLAIMS = ('--author', '--approver', '--by')\n"
        "import os\n"
        "given = json.loads(sys.stdin.read())\n"
        "for label, args in given['commands'].items():\n"
        "    who = [args[i + 1] for i, a in enumerate(args[:-1]) if a in CLAIMS]\n"
        "    os.environ['RETENTION_TOKEN'] = given['tokens'].get(who[0], '') if who else ''\n"
        "    sys.stdin = io.StringIO(given['stdin'].get(label, ''))\n"
        "    buf = io.StringIO()\n"
        "    try:\n"
        "        call_command(*args, stdout=buf, stderr=buf)\n"
        "        lines = buf.getvalue().strip().splitlines()\n"
        "        out[label] = [0, lines[0] if lines else '']\n"
        "    except CommandError as exc:\n"
        "        out[label] = [1, f'CommandError: {exc}']\n"
        "print('RESULTS' + json.dumps(out))\n"
    )
    result = zygote.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(env, DJANGO_SETTINGS_MODULE="config.settings"),
        input=json.dumps({"commands": commands, "tokens": tokens, "stdin": stdin or {}}),
        timeout=300,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return {k: tuple(v) for k, v in json.loads(result.stdout.split("RESULTS", 1)[1]).items()}
