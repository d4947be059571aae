"""The timestamp-type surface matrix: for a policy on each accepted timestamp type —
``timestamptz``, ``timestamp`` (without time zone), ``date``, and epoch numbers (``bigint``
milliseconds, ``integer`` seconds) — with eligible rows remaining mid-run, every page and
fragment of the URLconf, every export (CSV, manifest), every read-only command and /metrics
render without error and show real dates.

The pages are enumerated from the URLconf, not listed by hand: a new page is covered the day
it is added (a URL parameter this test cannot fill makes it fail, naming it). A naive and an
aware datetime subtracted anywhere (the forecast, the backlog age) is a 500 here."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from core.tokens import create_token
from retention import actions as retention_actions
from runs.actions import trigger_run
from runs.engine import planner, worker
from runs.models import DeadLetter, Run
from tests.conftest import token_for_claim
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import NOW, ROOT

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ROWS, DAYS = 3000, 40
# The column type and how a row's instant (``NOW - age``, age a SQL interval expression) is
# written in it; the policy fields it needs.
KINDS = {
    "timestamptz": ("timestamptz", "%(now)s::timestamptz - {age}", {}),
    "timestamp": ("timestamp", "(%(now)s::timestamptz - {age}) AT TIME ZONE 'UTC'", {}),
    # wall-clock time in the policy's zone, Europe/Berlin (Rails-style schemas, local clocks)
    "timestamp-berlin": (
        "timestamp",
        "(%(now)s::timestamptz - {age}) AT TIME ZONE 'Europe/Berlin'",
        {"timezone": "Europe/Berlin"},
    ),
    "date": ("date", "((%(now)s::timestamptz - {age}) AT TIME ZONE 'UTC')::date", {}),
    "bigint-ms": (
        "bigint",
        "(extract(epoch FROM %(now)s::timestamptz - {age}) * 1000)::bigint",
        {"timestamp_unit": "ms"},
    ),
    "integer-s": (
        "integer",
        "extract(epoch FROM %(now)s::timestamptz - {age})::integer",
        {"timestamp_unit": "s"},
    ),
}
# A number of seconds (10 digits) or milliseconds (13 digits) since the epoch in this decade,
# standing alone: what no surface may show in place of a date.
RAW_EPOCH = re.compile(r"(?<![\w.\-:])(?:1[78]\d{8}|1[78]\d{11})(?![\w.])")
RAW = {"key_lo", "key_hi", "hash", "prev_hash"}  # the audit record's exact, hashed values


def _build(name: str, kind: str) -> None:
    """``public.<name>``: ROWS rows over DAYS days before NOW, ids in time order, tenants
    1-5, the time in a column ``at`` of the kind's type, indexed."""
    column, value, _ = KINDS[kind]
    age = f"(({ROWS} - g) * interval '{DAYS * 86400 // ROWS} seconds')"
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{name}")
        cur.execute(
            f"CREATE TABLE public.{name} (id bigint PRIMARY KEY, tenant_id int NOT NULL,"
            f" at {column} NOT NULL, status text)"
        )
        cur.execute(
            f"INSERT INTO public.{name} SELECT g, 1 + g %% 5, {value.format(age=age)}, 'closed'"
            f" FROM generate_series(1, {ROWS}) AS g",
            {"now": NOW},
        )
        cur.execute(f"CREATE INDEX ON public.{name} (tenant_id, id)")
        cur.execute(f"CREATE INDEX ON public.{name} (at)")
        cur.execute(f"ANALYZE public.{name}")


def _spec(slug: str, table: str, kind: str) -> dict:
    return events_spec(
        slug=slug, table=table, timestamp="at", keep=[{"column": "status", "op": "=", "value": "disputed"}],
        **KINDS[kind][2],
    )  # fmt: skip


@pytest.fixture(params=list(KINDS))
def matrix(request, db, make_user, settings):
    """For one timestamp kind: an approved policy with a hold on tenant 4, a run of it with
    three chunks committed and eligible rows left, and a dead letter of a second policy of the
    same kind (its table dropped under its run)."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    kind = request.param
    _build("rr_matrix", kind)
    policy = approved_policy(make_user, **_spec("matrix", "rr_matrix", kind))
    officer = make_user("hilda", "compliance")
    hold = retention_actions.place_hold(actor=officer, reason="case 7", policy=policy, tenant="4")
    run, _ = trigger_run(policy, tick=NOW)
    planner.plan(run)
    for _ in range(3):
        assert worker.process_one(run).kind == worker.DONE
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE

    _build("rr_matrix_gone", kind)
    other = approved_policy(make_user, **_spec("matrix-gone", "rr_matrix_gone", kind))
    doomed, _ = trigger_run(other, tick=NOW)
    planner.plan(doomed)
    with connection.cursor() as cur:
        cur.execute("DROP TABLE public.rr_matrix_gone")
    assert worker.process_one(doomed).kind == worker.FAILED
    letter = DeadLetter.objects.get(run=doomed)
    return kind, policy, run, hold, letter


def _patterns(resolvers=None, prefix="", namespace=""):
    """Every (URL name, route, default kwargs) of the URLconf's pages, Django's admin left out
    (its own tests: tests/retention/test_admin.py) and the JSON API read by its schema."""
    for entry in resolvers if resolvers is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace in ("admin", "api"):  # the API: _api_reads below
                continue
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _patterns(entry.url_patterns, prefix + str(entry.pattern), ns)
        elif isinstance(entry, URLPattern) and entry.name:
            yield f"{namespace}{entry.name}", prefix + str(entry.pattern), entry.pattern.converters


def _urls(policy, run, hold, letter, token) -> dict[str, str]:
    values = {
        "slug": policy.slug,
        "number": policy.approved_version.number,
        "run_id": run.pk,
        "hold_id": hold.pk,
        "letter_id": letter.pk,
        "token_id": token.pk,
        "name": "policies",
    }
    urls = {}
    for name, route, converters in _patterns():
        missing = set(converters) - set(values)
        assert not missing, f"{name} ({route}) takes {missing}: give the matrix a value for it"
        given = {**values, "name": "default"} if name == "runs:target" else values
        urls[name] = reverse(name, kwargs={k: given[k] for k in converters})
    return urls


def _api_reads(client, secret: str, values: dict) -> dict[str, str]:
    """Every GET of the API's checked-in schema (api/openapi.json), with a bearer token:
    {path: body} of those that answered 200; none may fail with a server error."""
    schema = json.loads((ROOT / "api" / "openapi.json").read_text())
    bodies = {}
    for path, operations in schema["paths"].items():
        if "get" not in operations:
            continue
        url = re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]), path)
        response = client.get(url, HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert response.status_code < 500, (path, response.status_code)
        if response.status_code == 200:
            bodies[path] = _body(response)
    return bodies


def _no_raw_times(text: str, where: str) -> None:
    found = RAW_EPOCH.findall(text)
    assert not found, f"{where} shows raw epoch numbers {found[:3]}"


def _cli(*args) -> str:
    token_for_claim(args)
    out = io.StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def _body(response) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def test_every_surface_renders_real_dates_for_every_timestamp_type(matrix, client_for, users):
    kind, policy, run, hold, letter = matrix
    token, _ = create_token(users["auditor"], name="matrix")
    urls = _urls(policy, run, hold, letter, token)
    # a reader for every page: the first role it renders for (most are every role's)
    # (the sign-in page: signed out)
    roles = ("auditor", "compliance", "oncall", "viewer", None)
    readers = [client_for(role) for role in roles]
    rendered, post_only = {}, []
    for name, url in urls.items():
        for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
            statuses = []
            for reader in readers:
                response = reader.get(url, **headers)
                statuses.append(response.status_code)
                assert response.status_code < 500, (kind, name, url, response.status_code)
                if response.status_code == 405 and "GET" not in response.get("Allow", ""):
                    # a POST-only action: its GET is refused before the view reads a role
                    # or a table (``require_POST`` outermost), the same for every reader
                    post_only.append(name)
                    break
                if response.status_code == 200:
                    body = _body(response)
                    rendered[name] = body
                    if name not in {"runs:audit_export", "runs:manifest"}:
                        _no_raw_times(body, f"{name} ({kind})")
                    break
            else:
                if set(statuses) == {301}:  # a permanent redirect (the favicon), no page
                    continue
                pytest.fail(f"{name} ({url}) rendered for no role: {statuses}")
    # the pages an operator reads a run by are among them, and none is missing for want of a role
    for name in ("home", "metrics", "retention:policy_list", "retention:policy_detail",
                 "retention:version_detail", "retention:version_preview", "retention:holds",
                 "retention:hold_detail", "runs:list", "runs:detail", "runs:audit",
                 "runs:audit_export", "runs:manifest", "runs:dead_letters", "runs:activity"):  # fmt: skip
        assert name in rendered, (name, sorted(rendered))
    assert "retention:version_approve" in post_only

    cutoff_day = f"{run.cutoff:%Y-%m-%d}"
    assert cutoff_day in rendered["runs:detail"]

    # the JSON API, as a compliance officer's token reads it (a live preview is compliance's):
    # the run, the policy, its preview and version, the holds and the evidence answer, and
    # say times as dates
    spec = policy.approved_version.spec
    floor = retention_actions.request_floor(
        f"{spec['schema']}.{spec['table']}", "1 day", mode="governance", actor=users["compliance"],
        reason="the matrix reads a floor's times",
    )  # fmt: skip
    api = _api_reads(
        client_for(None),
        create_token(users["compliance"], name="matrix")[1],
        {"key": run.run_key, "slug": policy.slug, "number": policy.approved_version.number,
         "hold_id": hold.pk, "floor_id": floor.pk},
    )  # fmt: skip
    for path in ("/api/v1/runs/{key}", "/api/v1/policies/{slug}", "/api/v1/holds",
                 "/api/v1/policies/{slug}/preview", "/api/v1/runs/{key}/manifest.json",
                 "/api/v1/audit/export.csv"):  # fmt: skip
        assert path in api, (path, sorted(api))
    assert cutoff_day in api["/api/v1/runs/{key}"]
    for path, body in api.items():
        if path not in {"/api/v1/audit/export.csv", "/api/v1/runs/{key}/manifest.json"}:
            _no_raw_times(body, f"{path} ({kind})")
    # the version's preview names its oldest eligible row by its date (40 days before NOW),
    # and the overview's backlog is that row's age in days
    oldest = re.search(r"Oldest eligible</dt><dd>([^<]*)<", rendered["retention:version_detail"])
    first_day = f"{NOW - timedelta(days=DAYS):%Y-%m-%d}"  # the first row's day
    assert oldest and first_day in oldest.group(1), oldest and oldest.group(0)
    # (the oldest row is DAYS days before NOW, and NOW is a fixed day the wall clock has passed)
    oldest_days = (datetime.now(UTC) - (NOW - timedelta(days=DAYS))).days
    backlog = re.search(r'data-testid="backlog-age">(\d+)d ', rendered["home"])
    assert backlog and 20 <= int(backlog.group(1)) <= oldest_days + 1, rendered["home"][:3000]

    # evidence: the manifest and the CSV say every time as a date
    manifest = json.loads(rendered["runs:manifest"])
    assert manifest["cutoff"] == run.cutoff.isoformat()
    _no_raw_times(json.dumps({k: v for k, v in manifest.items() if k != "chunks"}), "manifest")
    rows = [r for r in csv.DictReader(io.StringIO(rendered["runs:audit_export"]))
            if r["policy"] == "matrix"]  # fmt: skip
    assert len(rows) == 3 and {r["cutoff"][:10] for r in rows} == {cutoff_day}
    for row in rows:
        _no_raw_times(json.dumps({k: v for k, v in row.items() if k not in RAW}), "CSV")

    # /metrics: the backlog is the age of a real row — between the retention (20 days) and
    # the oldest row's age now (40 days before NOW), never a number of milliseconds misread
    metrics = rendered["metrics"]
    age = re.search(
        r'retention_oldest_eligible_row_age_seconds\{policy="matrix"\} ([\d.e+]+)', metrics
    )
    assert age, metrics[:2000]
    oldest_now = (datetime.now(UTC) - (NOW - timedelta(days=DAYS))).total_seconds()
    assert 20 * 86400 < float(age.group(1)) <= oldest_now + 86400, age.group(0)
    assert re.search(r'retention_backlog_overdue_seconds\{policy="matrix"\} [\d.e+]+', metrics)

    # the read-only commands
    status = _cli("status", run.run_key)
    assert cutoff_day in status
    _no_raw_times(status, "retention status")
    data = json.loads(_cli("status", run.run_key, "--json"))
    assert data
    preview = _cli("policy", "preview", policy.slug)
    _no_raw_times(preview, "retention policy preview")
    assert re.search(r"20\d\d-\d\d-\d\d", preview), preview
    json.loads(_cli("policy", "preview", policy.slug, "--json"))
    _no_raw_times(_cli("policy", "list"), "retention policy list")
    # the plans show the statement's bound as PostgreSQL runs it, raw; the command says which
    # instant that number is
    explain = _cli("explain", policy.slug)
    for number in set(RAW_EPOCH.findall(explain)):
        assert re.search(rf"{number}\b[^\n]*20\d\d-\d\d-\d\d", explain), (number, explain[:600])
    assert re.search(r"cutoff 20\d\d-\d\d-\d\d", explain), explain[:600]
    _cli("check", run.run_key)
    _no_raw_times(_cli("hold", "list"), "retention hold list")
    _cli("audit", "verify")
    # and the commands that change state but read the table's times: a hold says what it covers
    # now, a reconciler pass plans and verifies
    placed = _cli("hold", "place", "--reason", "case 8", "--policy", policy.slug, "--tenant", "2",
                  "--by", "carla")  # fmt: skip
    assert re.search(r"[\d,]+ rows now", placed), placed
    _no_raw_times(placed, "retention hold place")
    _cli("reconcile")
