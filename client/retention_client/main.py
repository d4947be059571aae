"""``retention …`` against the API: the sub-commands of ``manage.py retention``, parsed here,
run by the server with the token's owner acting, printed as the server prints them."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

from .http import TOKEN_ENV, URL_ENV, Api, ApiRefusal, ClientError

ROLES = ("compliance", "oncall", "auditor", "viewer")
CLAIM = "optional check: refused unless RETENTION_TOKEN belongs to this user"
# what runs only where the database is (the server, with a database login)
SERVER_SIDE = {
    "drain": "runs the worker: it deletes rows with the worker's database login",
    "reconcile": "is the reconciler's pass, a process of the server",
    "startup": "arms the schedules, a step of the server's start-up",
    "explain": "runs the engine's statements under EXPLAIN ANALYZE with the worker's privileges",
    "grants": "changes the database's logins with the owner's login",
    "migrate": "changes the database's schema with the owner's login",
    "qcluster": "is a worker process of the server",
    "restore": "reads the archive's Parquet files and inserts rows with a database login",
}


class Failed(Exception):
    """The command's one error line (``CommandError: …``), after any output it had."""


def _dir_files(path: str) -> list[dict]:
    folder = Path(path)
    if not folder.is_dir():
        raise Failed(f"{path} is not a directory")
    return [
        {"name": p.name, "toml": _read(p)} for p in sorted(folder.glob("*.toml")) if p.is_file()
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Failed(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _password(o, doing: str) -> str:
    if o.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"Password (to confirm {doing}): ")
    raise Failed(f"{doing} asks for your password again: run at a terminal or use --password-stdin")


# handlers: (api, options) -> the server's answer carrying ``output`` (or an Output itself)
def policy_apply(api: Api, o):
    if Path(o.file).is_dir():
        return api.post("/policy-files/apply", {"files": _dir_files(o.file), "reason": o.reason})
    return api.post("/policies", {"toml": _read(Path(o.file)), "reason": o.reason})


def policy_pull(api: Api, o):
    folder = Path(o.dir)
    answer = api.post("/policy-files/pull", {"dir": o.dir, "files": _dir_files(o.dir)})
    for item in answer.get("files", []):
        try:
            (folder / item["name"]).write_text(item["toml"], encoding="utf-8")
        except OSError as exc:
            raise Failed(f"cannot write {folder / item['name']}: {exc.strerror or exc}") from None
    return answer


def evidence(api: Api, o):
    """The run's audit CSV and manifest written here, with the lines the server prints; or a
    policy's period's manifest over every target (``--policy SLUG --period P``)."""
    if o.policy:
        if o.run_key or o.csv or not o.manifest:
            raise Failed(
                "a period's evidence: --policy SLUG [--period P] --manifest FILE (no run key; "
                "the audit CSV is each run's: retention evidence RUN --csv FILE)"
            )
        data = api.raw(f"/policies/{o.policy}/manifest.json", period=o.period or None)
        _write(o.manifest, data)
        document = json.loads(data)
        totals = document["totals"]
        unreachable = totals["unreachable"]
        line = (
            f"{o.manifest}: the evidence manifest of {o.policy} for {document['period']['tick']} "
            f"over {totals['targets']} target(s): {totals['runs']} run(s), "
            f"{totals['rows_deleted']:,} row(s) deleted"
            + (f"; unreachable: {', '.join(unreachable)}" if unreachable else "")
        )
        return {"output": {"stdout": line + "\n"}}
    if not o.run_key:
        raise Failed("name a run (RUN) or a policy's period (--policy SLUG --period P)")
    if o.period:
        raise Failed("--period goes with --policy SLUG")
    if not o.csv and not o.manifest:
        raise Failed("name --csv FILE, --manifest FILE or both")
    key = api.get(f"/runs/{o.run_key}")["run"]["run_key"]
    lines = []
    if o.csv:
        data = api.raw("/audit/export.csv", run=key)
        _write(o.csv, data)
        count = data.count(b"\n") - 1
        lines.append(f"{o.csv}: the audit CSV of {key}, {count:,} line(s)")
    if o.manifest:
        _write(o.manifest, api.raw(f"/runs/{key}/manifest.json"))
        lines.append(f"{o.manifest}: the evidence manifest of {key}")
    return {"output": {"stdout": "".join(line + "\n" for line in lines)}}


def _write(path: str, data: bytes) -> None:
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise Failed(f"cannot write {path}: {exc.strerror or exc}") from None


def policy_approve(api: Api, o):
    password = _password(o, "the approval")
    return api.post(
        f"/policies/{o.slug}/versions/{o.number}/approve",
        {"reason": o.reason, "password": password},
    )


def hold_place(api: Api, o):
    body = {"reason": o.reason, "policy": o.policy, "tenant": o.tenant,
            "key_from": o.key_from, "key_to": o.key_to}  # fmt: skip
    return api.post("/holds", body)


def user_add(api: Api, o):
    if o.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif sys.stdin is not None and sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password (again): ") != password:
            raise Failed("the passwords differ")
    else:
        raise Failed("no terminal to prompt for a password: use --password-stdin")
    # then your own password, asked again (a token alone creates no one)
    mine = _password(o, f"creating {o.username}")
    return api.post("/users", {"username": o.username, "password": password, "email": o.email,
                               "actor_password": mine})  # fmt: skip


def role_change(api: Api, o, name: str):
    password = _password(o, f"the {name} of {o.role}")
    return api.post(f"/roles/{name}", {"username": o.username, "role": o.role,
                                       "reason": o.reason, "password": password})  # fmt: skip


def check(api: Api, o):
    if o.shadow:
        raise Failed(
            "`retention check --shadow` reads a copy of the table: run it on the server "
            "(manage.py retention check … --shadow …); without --shadow it runs here"
        )
    return api.post(f"/runs/{o.run_key}/check", expect_drained=o.expect_drained)


def audit_verify(api: Api, o):
    import json

    anchors = []
    for path in o.against or []:
        try:
            anchors.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise Failed(f"{path}: not a readable JSON file ({exc.__class__.__name__})") from None
    return api.post("/audit/verify", {"anchors": anchors})


def refuse(message: str):
    """A handler for what this command line does not do, saying what to do instead."""

    def handler(api, o):
        raise Failed(message)

    return handler


def server_side_message(name: str) -> str:
    return (
        f"`retention {name}` {SERVER_SIDE[name]}: run it on the server "
        f"(manage.py retention {name}); this command line has no database connection"
    )


def register(sub) -> None:  # noqa: PLR0915 - one grammar, as manage.py retention's
    def add(parent, name, handler, help_text=""):
        p = parent.add_parser(name, help=help_text)
        p.set_defaults(handler=handler)
        return p

    def reason(p, required=True):
        p.add_argument("--reason", required=required, default="")

    policy = sub.add_parser("policy", help="write, preview, approve and list policies")
    ps = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    p = add(ps, "apply", policy_apply, "submit a policy file, or a directory's changed ones")
    p.add_argument("file", metavar="FILE.toml|DIR")
    p.add_argument("--author", help=CLAIM)
    reason(p, required=False)
    p = add(ps, "plan", lambda api, o: api.post(
        "/policy-files/plan", {"files": _dir_files(o.dir)}), "compare a directory with what is approved")  # fmt: skip
    p.add_argument("dir", metavar="DIR")
    p = add(ps, "approve", policy_approve, "approve a submitted version (asks for your password)")
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, required=True, metavar="N")
    p.add_argument("--approver", help=CLAIM)
    p.add_argument("--password-stdin", action="store_true")
    reason(p, required=False)
    p = add(ps, "reject", lambda api, o: api.post(
        f"/policies/{o.slug}/versions/{o.number}/reject", {"reason": o.reason}), "reject a version")  # fmt: skip
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, required=True, metavar="N")
    p.add_argument("--approver", help=CLAIM)
    reason(p)
    p = add(ps, "preview", lambda api, o: api.get(f"/policies/{o.slug}/preview", json=o.json))
    p.add_argument("slug")
    p.add_argument("--json", action="store_true")
    add(ps, "list", lambda api, o: api.get("/policies"))
    p = add(ps, "show", lambda api, o: api.get(
        f"/policies/{o.slug}/file", version=o.number, toml=o.toml), "a version as a file")  # fmt: skip
    p.add_argument("slug")
    p.add_argument("--version", dest="number", type=int, metavar="N")
    p.add_argument("--toml", action="store_true")
    p = add(ps, "pull", policy_pull, "write the approved versions into DIR")
    p.add_argument("dir", metavar="DIR")
    for name in ("enable", "disable", "pause", "resume"):
        p = add(ps, name, lambda api, o, name=name: api.post(
            f"/policies/{o.slug}/{name}", {"reason": o.reason}))  # fmt: skip
        p.add_argument("slug")
        p.add_argument("--by", help=CLAIM)
        reason(p)

    hold = sub.add_parser("hold", help="place, release and list legal holds")
    hs = hold.add_subparsers(dest="hold_command", required=True, metavar="COMMAND")
    p = add(hs, "place", hold_place, "place a legal hold")
    reason(p)
    p.add_argument("--by", help=CLAIM)
    p.add_argument("--policy", metavar="SLUG")
    p.add_argument("--tenant", metavar="T", action="append")
    p.add_argument("--key-from", type=int, metavar="N")
    p.add_argument("--key-to", type=int, metavar="N")
    for name in ("release", "approve-release", "withdraw-release", "refuse-release"):
        p = add(hs, name, lambda api, o, name=name: api.post(
            f"/holds/{o.hold_id}/{name}", {"reason": o.reason} if name != "approve-release"
            else {"reason": o.reason, "password": _password(o, "the release")}))  # fmt: skip
        p.add_argument("hold_id", type=int, metavar="ID")
        p.add_argument("--by", help=CLAIM)
        reason(p)
        if name == "approve-release":
            p.add_argument("--password-stdin", action="store_true",
                           help="read your password from standard input")  # fmt: skip
    p = add(hs, "list", lambda api, o: api.get("/holds", all=o.all))
    p.add_argument("--all", action="store_true")

    floor = sub.add_parser("floor", help="set, approve and list retention floors")
    fs = floor.add_subparsers(dest="floor_command", required=True, metavar="COMMAND")
    p = add(fs, "set", lambda api, o: api.post("/floors", {
        "table": o.table, "period": o.period, "mode": o.mode, "reason": o.reason}),
        "request a floor on a table (another officer approves)")  # fmt: skip
    p.add_argument("table", metavar="SCHEMA.TABLE")
    p.add_argument("period", metavar="PERIOD")
    p.add_argument("--mode", required=True, choices=("compliance", "governance"))
    reason(p)
    p.add_argument("--by", help=CLAIM)
    for name in ("approve", "refuse"):
        p = add(fs, name, lambda api, o, name=name: api.post(
            f"/floors/{o.floor_id}/{name}", {"reason": o.reason}))  # fmt: skip
        p.add_argument("floor_id", type=int, metavar="ID")
        reason(p)
        p.add_argument("--by", help=CLAIM)
    add(fs, "list", lambda api, o: api.get("/floors"), "every floor, newest first")

    target = sub.add_parser("target", help="the databases the product deletes from")
    ts = target.add_subparsers(dest="target_command", required=True, metavar="COMMAND")
    add(ts, "list", lambda api, o: api.get("/targets"), "the targets and whether each answers")
    p = add(ts, "add", lambda api, o: api.post("/targets", {
        "name": o.name, "dsn_env": o.dsn_env or "", "dsn_file": o.dsn_file or "",
        "group": o.group or ""}), "register a target (its URL is read on the server)")  # fmt: skip
    p.add_argument("name")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dsn-env", metavar="VAR")
    source.add_argument("--dsn-file", metavar="PATH")
    p.add_argument("--group", metavar="LABEL")
    p.add_argument("--by", help=CLAIM)
    p = add(ts, "remove", lambda api, o: api.post(
        f"/targets/{o.name}/remove", {"reason": o.reason}), "forget a target")  # fmt: skip
    p.add_argument("name")
    p.add_argument("--by", help=CLAIM)
    reason(p, required=False)
    p = add(ts, "migrate", refuse(
        "`retention target migrate` installs the ledger with the target's owner login: run it on"
        " the server (manage.py retention target migrate NAME)"), "runs on the server only")  # fmt: skip
    p.add_argument("name")
    p.set_defaults(offline=True)

    p = add(sub, "trigger", lambda api, o: api.post(
        "/runs", {"policy": o.slug, "period": o.period}), "create (or find) a run")  # fmt: skip
    p.add_argument("slug")
    p.add_argument("--period")
    p.add_argument("--by", help=CLAIM)
    p = add(sub, "status", lambda api, o: api.get(f"/runs/{o.run_key}", json=o.json))
    p.add_argument("run_key")
    p.add_argument("--json", action="store_true")
    for name in ("pause", "resume", "cancel", "confirm", "retry"):
        p = add(sub, name, lambda api, o, name=name: api.post(
            f"/runs/{o.run_key}/{name}", {"reason": o.reason}))  # fmt: skip
        p.add_argument("run_key")
        reason(p)
        p.add_argument("--by", help=CLAIM)
    for name in ("replay", "discard"):
        p = add(sub, name, lambda api, o, name=name: api.post(f"/dead-letters/{name}", {
            "ids": o.ids, "all": o.all, "run": o.run or "", "cause": o.cause or "",
            "table": o.table or "", "policy": o.policy or "", "reason": o.reason}))  # fmt: skip
        p.add_argument("ids", type=int, nargs="*", metavar="ID")
        p.add_argument("--all", action="store_true", help="every open dead letter matching")
        p.add_argument("--run", metavar="RUN")
        p.add_argument("--cause")
        p.add_argument("--table")
        p.add_argument("--policy", metavar="SLUG")
        reason(p)
        p.add_argument("--by", help=CLAIM)
    p = add(sub, "dead-letters", lambda api, o: api.get(
        "/listings/dead-letters", run=o.run_key or "", all=o.all, cause=o.cause or "",
        table=o.table or "", policy=o.policy or ""), "list dead letters (of a run)")  # fmt: skip
    p.add_argument("run_key", nargs="?", metavar="RUN")
    p.add_argument("--all", action="store_true")
    p.add_argument("--cause")
    p.add_argument("--table")
    p.add_argument("--policy", metavar="SLUG")
    p = add(sub, "runs", lambda api, o: api.get(
        "/listings/runs", policy=o.policy or "", state=o.state or "", limit=o.limit),
        "the latest runs")  # fmt: skip
    p.add_argument("--policy", metavar="SLUG")
    p.add_argument("--state")
    p.add_argument("--limit", type=int, default=50)
    p = add(sub, "kill-switch", lambda api, o: api.post(
        "/kill-switch", {"state": o.state, "reason": o.reason}))  # fmt: skip
    p.add_argument("state", choices=["on", "off"])
    reason(p)
    p.add_argument("--by", help=CLAIM)
    p = add(sub, "evidence", evidence, "write a run's audit CSV and evidence manifest to files, "
            "or a policy's period's manifest over every target (--policy SLUG --period P "
            "--manifest FILE)")  # fmt: skip
    p.add_argument("run_key", metavar="RUN", nargs="?")
    p.add_argument("--policy", metavar="SLUG", help="a policy's period over every target")
    p.add_argument(
        "--period", help="with --policy: YYYY-MM-DD or YYYY-MM-DDTHH:MM (default: latest)"
    )
    p.add_argument("--csv", metavar="FILE")
    p.add_argument("--manifest", metavar="FILE")
    p = add(sub, "check", check, "check a run's invariants")
    p.add_argument("run_key")
    p.add_argument("--shadow", metavar="SCHEMA.TABLE")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--expect-drained", dest="expect_drained", action="store_true",
                       default=None)  # fmt: skip
    group.add_argument("--no-expect-drained", dest="expect_drained", action="store_false")

    audit = sub.add_parser("audit", help="audit trail")
    au = audit.add_subparsers(dest="audit_cmd", required=True)
    p = add(au, "verify", audit_verify, "check the audit chain and the operator log")
    p.add_argument("--against", nargs="+", metavar="FILE")
    add(au, "checkpoint", refuse(
        "`retention audit checkpoint` signs with RETENTION_EVIDENCE_KEY, which only the "
        "checkpoint job holds: run it on the server; GET /api/v1/audit/checkpoint gives the "
        "latest one")).set_defaults(offline=True)  # fmt: skip

    role = sub.add_parser("role", help="grant, revoke and list roles")
    rs = role.add_subparsers(dest="role_command", required=True, metavar="COMMAND")
    for name in ("grant", "revoke"):
        p = add(rs, name, lambda api, o, name=name: role_change(api, o, name),
                "asks for your password again")  # fmt: skip
        p.add_argument("username")
        p.add_argument("role", choices=ROLES)
        reason(p, required=False)
        p.add_argument("--by", help=CLAIM)
        p.add_argument("--password-stdin", action="store_true")
    add(rs, "list", lambda api, o: api.get("/roles"))
    user = sub.add_parser("user", help="add users")
    us = user.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    p = add(us, "add", user_add, "create a user (no role yet)")
    p.add_argument("username")
    p.add_argument("--email", default="")
    p.add_argument("--password-stdin", action="store_true")
    p.add_argument("--by", help=CLAIM)
    token = sub.add_parser("token", help="personal API tokens")
    ts = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    add(ts, "create", refuse(
        "a token cannot create tokens: create one on the dashboard's API tokens page (it asks "
        "for your password), or with manage.py retention token create on the server"),
    ).set_defaults(offline=True)  # fmt: skip
    for name in SERVER_SIDE:
        p = add(sub, name, refuse(server_side_message(name)), "runs on the server only")
        p.set_defaults(offline=True)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="retention",
        description=f"Retention Runner operations over its API ({URL_ENV}, {TOKEN_ENV}).",
    )
    register(top.add_subparsers(dest="area", required=True, metavar="AREA"))
    return top


def _claim(api: Api, o) -> None:
    """``--by``/``--author``/``--approver`` only double-check who is acting."""
    claimed = next(
        (
            (flag, value)
            for flag in ("by", "author", "approver")
            if (value := getattr(o, flag, None))
        ),
        None,
    )
    if claimed:
        me = api.get("/me")["username"]
        if claimed[1].strip() != me:
            raise Failed(
                f"--{claimed[0]} {claimed[1]} is not who is acting: the credential is {me}'s"
            )


def run(argv: list[str] | None = None, *, stdout=None, stderr=None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SERVER_SIDE:  # whatever its options: not here
        stderr.write(f"CommandError: {server_side_message(argv[0])}\n")
        return 1
    options = parser().parse_args(argv)
    try:
        if getattr(options, "offline", False):  # refused before any connection
            options.handler(None, options)
        url = os.environ.get(URL_ENV, "")
        if not url:
            raise Failed(
                f"set {URL_ENV} to the Retention Runner's address (https://…) and {TOKEN_ENV} "
                "to your personal API token; on the server, manage.py retention runs the same "
                "commands with the database"
            )
        api = Api(url, os.environ.get(TOKEN_ENV, ""))
        _claim(api, options)
        answer = options.handler(api, options)
    except ApiRefusal as exc:
        stdout.write(exc.body.get("stdout") or "")
        stderr.write(exc.body.get("stderr") or "")
        stderr.write(f"CommandError: {exc}\n")
        return 1
    except (Failed, ClientError) as exc:
        stderr.write(f"CommandError: {exc}\n")
        return 1
    output = answer.get("output", answer) if isinstance(answer, dict) else {}
    stdout.write(output.get("stdout", ""))
    stderr.write(output.get("stderr", ""))
    stdout.flush()
    return int(output.get("exit_code") or 0)


def main(argv: list[str] | None = None) -> int:
    return run(argv)
