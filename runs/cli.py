"""``retention trigger|status|drain|pause|resume|cancel|confirm|replay|discard|kill-switch|
reconcile|startup|audit`` sub-commands: operations without a browser."""

from __future__ import annotations

import difflib
import json
import threading
import time
from datetime import datetime
from pathlib import Path

from django.core.management.base import CommandError
from django.db import connection, connections
from django.utils import timezone

from core import locks, timeouts
from core.cli_identity import acting_user
from core.filters import as_id
from core.formatting import in_words, state_label
from core.oplog import unsigned_actions, verify_operator_log
from core.roles import AUDITOR, COMPLIANCE, check_role, roles_of
from core.seals import broken_seals
from retention.decisions import unverified_decisions
from retention.models import KillSwitch, Policy, PolicyVersion
from retention.schedule_math import latest_tick, tick_for_period
from runs import actions, restores
from runs.actions import (
    ActionError,
    discard_dead_letter,
    replay_dead_letter,
    set_kill_switch,
)
from runs.engine.explain import chunking as explain_chunking
from runs.engine.explain import cutoff as explain_cutoff
from runs.engine.explain import explain as explain_policy
from runs.engine.schedules import ensure_system_schedules
from runs.engine.worker import drain as drain_run
from runs.evidence import anchors as evidence
from runs.evidence import archives, exports
from runs.evidence import fleet as fleet_evidence
from runs.evidence.archives import archived_rows
from runs.evidence.audit import verify_chain
from runs.fleet import drain as fleet_drain
from runs.fleet import runs as fleet_runs
from runs.fleet.reconcile import reconcile_everywhere
from runs.models import DeadLetter, RestoreRequest, Run
from runs.progress import progress_for
from runs.status import run_status
from targets import connections as fleet_connections


def _actor(options):
    """The person acting (a personal API token; core.cli_identity); roles are the actions'."""
    return acting_user(options)


def _run(key: str):
    run = Run.objects.select_related("policy", "policy_version").filter(run_key=key).first()
    if run is None and as_id(key) is not None:
        run = Run.objects.select_related("policy", "policy_version").filter(pk=as_id(key)).first()
    if run is None:
        raise CommandError(f"no run with key {key!r}")
    return run


def _policy(slug: str):
    policy = Policy.objects.filter(slug=slug).first()
    if policy is None:
        raise CommandError(f"no policy {slug!r}")
    return policy


def _parse_period(policy, text: str | None) -> datetime:
    """The tick a manual trigger stands for (``schedule_math.tick_for_period``)."""
    try:
        return tick_for_period(policy, text, timezone.now())
    except ValueError as exc:
        raise CommandError(f"--period: {exc}") from None


def trigger(cmd, o):
    """One run key per target of the policy, one a line (runs.fleet.runs)."""
    policy = _policy(o["slug"])
    tick = _parse_period(policy, o.get("period"))
    made = fleet_runs.trigger_everywhere(policy, tick=tick, source="manual", actor=_actor(o))
    for name, run, note in made:
        if run is None:
            cmd.stderr.write(f"{name}: no run: {note}")
            continue
        cmd.stdout.write(run.run_key)
        if note != "created":  # the period's run exists: say so, and of which version
            approved = policy.approved_version
            newer = (
                f"; the approved version is now v{approved.number}"
                if approved is not None and approved.pk != run.policy_version_id
                else ""
            )
            # the version's number, read where the run's version lives (the same id on a
            # target's mirror as on the control database)
            number = PolicyVersion.objects.get(pk=run.policy_version_id).number
            cmd.stderr.write(
                f"already exists: the run of this period, v{number}, "
                f"{state_label(run.state)}{newer}"
            )
    if any(run is None for _name, run, _note in made):
        raise CommandError("some targets got no run (above); trigger again when they answer")


def status(cmd, o):
    name, run = fleet_runs.find(o["run_key"])
    if run is None and name != fleet_connections.DEFAULT:
        write_status(cmd, fleet_runs.unreachable_status(name, o["run_key"]), as_json=o["json"])
        return
    with fleet_connections.on(name):
        data = run_status(_run(o["run_key"]))
    write_status(cmd, fleet_runs.noted(name, {**data, "target": name}), as_json=o["json"])


def write_status(cmd, data: dict, *, as_json: bool) -> None:
    if as_json:
        cmd.stdout.write(json.dumps(data, indent=2, default=str))
        return
    for key, value in data.items():
        cmd.stdout.write(f"{key:26} {human(value)}")


def human(value) -> str:
    """A status value as a person reads it (``core.formatting.in_words``)."""
    return in_words(value)


def drain(cmd, o):
    """``--workers N``: N workers in this process — this thread and N - 1 more, each with its
    own database connection (Django's are per thread) — on the same run and options. One
    process start-up whatever N; the workers spend their time waiting on the database, which
    releases the interpreter's lock."""
    results: list = [None] * max(1, o["workers"])
    if o.get("run_key"):
        names = [fleet_runs.target_of_key(o["run_key"])]
    else:
        names = fleet_connections.all_names()

    def work(i: int) -> None:
        try:
            with timeouts.engine_session():
                results[i] = fleet_drain.drain_everywhere(
                    names,
                    lambda: _drain_round(o),
                    wait_while_active,
                    worker=i,
                    until_idle=o["until_idle"],
                    idle_s=IDLE_RETRY_S,
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the command below
            results[i] = exc
        finally:
            if i:
                connections.close_all()  # this thread's own connections

    helpers = [
        threading.Thread(target=work, args=(i,), name=f"drain-{i + 1}", daemon=True)
        for i in range(1, len(results))
    ]
    for helper in helpers:
        helper.start()
    try:
        work(0)
    finally:
        for helper in helpers:
            helper.join()
    failed = [r for r in results if isinstance(r, BaseException)]
    for i, r in enumerate(results):
        if len(results) > 1 and not isinstance(r, BaseException):
            cmd.stdout.write(f"worker {i + 1}: {_drained(r)}")
    if failed:
        if len(results) == 1:
            raise failed[0]
        raise CommandError(f"a drain worker failed: {failed[0]!r}")
    total = {k: sum(r[k] for r in results) for k in ("chunks", "rows", "failed")}
    cmd.stdout.write(_drained(total))
    unreachable = {name: why for r in results for name, why in r["unreachable"].items()}
    for name, why in sorted(unreachable.items()):
        cmd.stderr.write(f"target {name} did not answer; its runs wait for it: {why}")


def runs_list(cmd, o):
    """``retention runs [--policy SLUG] [--state STATE]``: the latest runs, newest first, one
    line each with the run's key, version, stage, state and progress (``runs.progress``)."""
    runs = Run.objects.select_related("policy", "policy_version").order_by("-created_at", "-id")
    if o.get("policy"):
        runs = runs.filter(policy=_policy(o["policy"]))
    if o.get("state"):
        states = {s.value for s in Run.State}
        if o["state"] not in states:
            raise CommandError(
                f"--state {o['state']!r}: one of {', '.join(sorted(states))}"
                + (f" (did you mean {near[0]!r}?)" if (near := _near(o["state"], states)) else "")
            )
        runs = runs.filter(state=o["state"])
    runs = list(runs[: max(1, min(o.get("limit") or 50, 500))])
    if not runs:
        cmd.stdout.write("no runs")
        return
    figures = progress_for([r.pk for r in runs], now=timezone.now())
    for run in runs:
        p = figures[run.pk]
        done = (
            f"counted {p.rows_deleted:,} row(s)"
            if run.counts_only
            else f"deleted {p.rows_deleted:,} of {p.expected_bound}"
            f"{'' if p.expected_bound == '~' else ' '}{p.rows_expected:,} row(s)"
        )
        cmd.stdout.write(
            f"{run.run_key}  v{run.policy_version.number} {run.rollout}  "
            f"{state_label(run.state)}  {done}, {p.chunks_done}/{p.chunks_total} chunks  "
            f"created {run.created_at:%Y-%m-%d %H:%M} UTC"
        )


def _near(word: str, choices) -> list[str]:
    return difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)


def _drained(total: dict) -> str:
    return (
        f"drained {total['chunks']} chunk(s), {total['rows']} row(s); {total['failed']} failure(s)"
    )


IDLE_RETRY_S = 0.5  # every run idle (backing off, throttled, chunks in other hands): retry then
IDLE_POLL_S = 0.05  # meanwhile, how often to look whether the runs are still active


def wait_while_active(ids, seconds: float) -> bool:
    """Wait up to ``seconds`` while any run of ``ids`` is active. False as soon as none is
    (a run another worker is verifying ends without this one), True when the time is up.
    While another session concludes one of them (``reconciler.finish_run``: the verification)
    it waits for that transaction to end rather than looking again every ``IDLE_POLL_S``."""
    end = time.monotonic() + seconds
    while Run.objects.filter(pk__in=ids, state=Run.State.ACTIVE).exists():
        left = end - time.monotonic()
        if left <= 0:
            return True
        if not _wait_for_finisher(ids, left):
            time.sleep(min(IDLE_POLL_S, left))
    return False


def _wait_for_finisher(ids, seconds: float) -> bool:
    """When a session is concluding one of the runs ``ids`` (it holds ``locks.FINISHER`` for
    the run), wait up to ``seconds`` for its transaction to end; True if one was waited for.
    Each look is a shared lock taken and released by one statement: a finisher waits behind
    this drain for one statement at most."""
    for run_id in ids:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock_shared(%s, %s)", [locks.FINISHER, run_id])
            if cur.fetchone()[0]:
                continue  # nobody is concluding this run
        timeouts.wait_for_lock(
            seconds, lambda run_id=run_id: locks.xact_lock(locks.FINISHER, run_id, shared=True)
        )
        return True
    return False


def _drain_round(o) -> dict:
    """One round on the database in place: each active run (of ``RUN_KEY``, when named)
    drained until nothing of it is admissible now or its ``--budget`` is spent. Its counters,
    and ``active``: the ids of the runs it found active."""
    runs = Run.objects.filter(state=Run.State.ACTIVE)
    if o.get("run_key"):
        runs = runs.filter(run_key=o["run_key"])
    ids = list(runs.values_list("id", flat=True))
    total = {"chunks": 0, "rows": 0, "failed": 0, "active": ids}
    for run_id in ids:
        stats = drain_run(run_id, budget_s=o["budget"], until_idle=True)
        for k in ("chunks", "rows", "failed"):
            total[k] += stats[k]
    return total


def _control(action_name):
    def handler(cmd, o):
        actor = _actor(o)
        name = fleet_runs.target_of_key(o["run_key"])
        if name != fleet_connections.DEFAULT and not isinstance(actor, str):
            roles_of(actor)  # read on the control database, remembered on the person
        with fleet_connections.on(name):
            run = _run(o["run_key"])
            getattr(actions, action_name)(
                run, actor=actor, reason=o["reason"], expected=o.get("expected")
            )
            run.refresh_from_db()
        cmd.stdout.write(f"{run.run_key}: {run.state}")

    return handler


def _letter(letter_id: int):
    letter = DeadLetter.objects.filter(pk=letter_id).first()
    if letter is None:
        raise CommandError(f"no dead letter #{letter_id}")
    return letter


def _matching(o) -> list[DeadLetter]:
    """The open dead letters ``--all`` names, narrowed by ``--run``, ``--cause``, ``--table``
    and ``--policy``."""
    return list(
        actions.open_letters_matching(
            run=_run(o["run"]) if o.get("run") else None,
            cause=o.get("cause") or "",
            table=o.get("table") or "",
            policy=o.get("policy") or "",
        )
    )


def _chosen(o) -> list[DeadLetter] | None:
    """The letters a bulk command names (``--all`` with filters, or several ids); None for
    one id (the single decision)."""
    if o.get("all"):
        letters = _matching(o)
        if not letters:
            raise CommandError("no open dead letter matches")
        return letters
    ids = o.get("ids") or ([o["id"]] if o.get("id") is not None else [])
    if not ids:
        raise CommandError("name dead letter ids, or --all (with --run, --cause, --table)")
    if len(ids) == 1:
        return None
    return [_letter(i) for i in ids]


def _ids(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)


def replay(cmd, o):
    letters = _chosen(o)
    if letters is None:
        letter_id = (o.get("ids") or [o.get("id")])[0]
        chunk = replay_dead_letter(_letter(letter_id), actor=_actor(o), reason=o["reason"])
        cmd.stdout.write(
            f"dead letter #{letter_id} replayed" + (f" as chunk #{chunk.pk}" if chunk else "")
        )
        return
    ids = actions.replay_dead_letters(letters, actor=_actor(o), reason=o["reason"])
    cmd.stdout.write(f"{len(ids)} dead letter(s) replayed: {_ids(ids)}")


def discard(cmd, o):
    letters = _chosen(o)
    if letters is None:
        letter_id = (o.get("ids") or [o.get("id")])[0]
        discard_dead_letter(_letter(letter_id), actor=_actor(o), reason=o["reason"])
        cmd.stdout.write(f"dead letter #{letter_id} discarded")
        return
    ids = actions.discard_dead_letters(letters, actor=_actor(o), reason=o["reason"])
    cmd.stdout.write(f"{len(ids)} dead letter(s) discarded: {_ids(ids)}")


def dead_letters(cmd, o):
    """``retention dead-letters [RUN]``: the open dead letters (``--all``: resolved ones too),
    one line each with its id, cause, run, table and chunk."""
    letters = DeadLetter.objects.select_related("run", "chunk").order_by("pk")
    if not o.get("all"):
        letters = letters.filter(resolution=DeadLetter.Resolution.OPEN)
    letters = actions.filter_letters(
        letters,
        run=_run(o["run_key"]) if o.get("run_key") else None,
        cause=o.get("cause") or "",
        table=o.get("table") or "",
        policy=o.get("policy") or "",
    )
    letters = list(letters[:1000])
    if not letters:
        cmd.stdout.write("no open dead letters" if not o.get("all") else "no dead letters")
        return
    for letter in letters:
        context = letter.context or {}
        where = f"chunk #{letter.chunk_id}" if letter.chunk_id else context.get("stage", "-")
        if letter.chunk is not None:
            tenant = f" tenant {letter.chunk.tenant}" if letter.chunk.tenant else ""
            where += f"{tenant} keys [{letter.chunk.key_from}, {letter.chunk.key_to})"
        run = letter.run.run_key if letter.run_id else "-"
        state = letter.resolution
        if letter.resolution != DeadLetter.Resolution.OPEN:
            state += f" by {letter.resolved_by}"
        cmd.stdout.write(
            f"#{letter.pk}  {state}  {letter.sqlstate or letter.error_class}  run {run}  "
            f"table {context.get('table', '-')}  {where}  attempts {letter.attempts}: "
            f"{letter.message}"
        )
    cmd.stdout.write(f"{len(letters)} dead letter(s)")


def kill_switch(cmd, o):
    now = KillSwitch.objects.filter(name="global").first()
    wanted = o["state"] == "on"
    if now is not None and now.on == wanted and o.get("expected") is None:
        by = f" (turned {o['state']} by {now.changed_by}: “{now.reason}”)" if now.changed_by else ""
        cmd.stdout.write(f"kill switch already {o['state']}{by}; nothing changed")
        return
    switch = set_kill_switch(
        o["state"] == "on", actor=_actor(o), reason=o["reason"], expected=o.get("expected")
    )
    cmd.stdout.write(f"kill switch {'on' if switch.on else 'off'}")


def evidence_files(cmd, o):
    """``retention evidence RUN --csv FILE --manifest FILE``: the run's audit CSV and its
    manifest, as the run page and the API give them, written to files (auditor, compliance).
    ``retention evidence --policy SLUG [--period P] --manifest FILE``: the manifest of a
    policy's period over every target (``runs.evidence.fleet``)."""
    check_role(_actor(o), AUDITOR, COMPLIANCE)
    if o.get("policy"):
        if o.get("run_key") or o.get("csv") or not o.get("manifest"):
            raise CommandError(
                "a period's evidence: --policy SLUG [--period P] --manifest FILE (no run key; "
                "the audit CSV is each run's: retention evidence RUN --csv FILE)"
            )
        policy = _policy(o["policy"])
        tick = _parse_period(policy, o.get("period"))
        document = fleet_evidence.period_manifest(policy, tick)
        Path(o["manifest"]).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        totals = document["totals"]
        unreachable = totals["unreachable"]
        cmd.stdout.write(
            f"{o['manifest']}: the evidence manifest of {policy.slug} for {tick.isoformat()} "
            f"over {totals['targets']} target(s): {totals['runs']} run(s), "
            f"{totals['rows_deleted']:,} row(s) deleted"
            + (f"; unreachable: {', '.join(unreachable)}" if unreachable else "")
        )
        return
    if not o.get("run_key"):
        raise CommandError("name a run (RUN) or a policy's period (--policy SLUG --period P)")
    if o.get("period"):
        raise CommandError("--period goes with --policy SLUG")
    if not o.get("csv") and not o.get("manifest"):
        raise CommandError("name --csv FILE, --manifest FILE or both")
    target = fleet_runs.target_of_key(o["run_key"])
    if target != fleet_connections.DEFAULT and fleet_connections.valid_name(target):
        _target_run_manifest(cmd, o, target)
        return
    run = _run(o["run_key"])
    if o.get("csv"):
        data = b"".join(exports.csv_rows(exports.AuditFilters(run=run.run_key)))
        Path(o["csv"]).write_bytes(data)
        cmd.stdout.write(evidence_line(o["csv"], run.run_key, csv_lines=data.count(b"\n") - 1))
    if o.get("manifest"):
        Path(o["manifest"]).write_text("".join(exports.manifest_json(run)), encoding="utf-8")
        cmd.stdout.write(evidence_line(o["manifest"], run.run_key))


def _target_run_manifest(cmd, o, target: str) -> None:
    """A target's run: its manifest, read on its ledger (its audit CSV is not served yet: its
    period's manifest and the manifest cover it)."""
    if o.get("csv"):
        raise CommandError(
            f"the audit CSV of a run on target {target} is not served yet: write its manifest "
            "(--manifest FILE) or its period's (--policy SLUG --period P --manifest FILE)"
        )
    name, run = fleet_runs.find(o["run_key"])
    if run is None and name != fleet_connections.DEFAULT:
        raise CommandError(fleet_runs.unreachable_status(name, o["run_key"])["state_reason"])
    if run is None:
        raise CommandError(f"no run with key {o['run_key']!r}")
    text = "".join(exports.manifest_on(name, run))
    Path(o["manifest"]).write_text(text, encoding="utf-8")
    cmd.stdout.write(evidence_line(o["manifest"], run.run_key))


def evidence_line(path: str, run_key: str, *, csv_lines: int | None = None) -> str:
    if csv_lines is None:
        return f"{path}: the evidence manifest of {run_key}"
    return f"{path}: the audit CSV of {run_key}, {csv_lines:,} line(s)"


def reconcile(cmd, o):
    """One pass over the control database and then each target's ledger."""
    with timeouts.engine_session():
        report = reconcile_everywhere()
    cmd.stdout.write(json.dumps(report, default=str))


def startup(cmd, o):
    """Arm the schedules, and start a run now for each policy on each of its targets where it
    has none (demo start-up); a target that does not answer or refuses is named, the others
    start."""
    ensure_system_schedules()
    for policy in Policy.objects.filter(enabled=True):
        if policy.approved_version is None:
            continue
        try:
            made = fleet_runs.start_where_none(policy, tick=latest_tick(policy, timezone.now()))
        except ActionError as exc:
            cmd.stdout.write(f"{policy.slug}: {exc}")
            continue
        for name, run, note in made:
            if run is not None:
                cmd.stdout.write(f"started {run.run_key} ({run.state})")
            elif note != "has runs":
                where = "" if name == fleet_connections.DEFAULT else f" on {name}"
                cmd.stdout.write(f"{policy.slug}{where}: {note}")


def _instant(text: str | None, what: str):
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"{what} must be a date or time like 2026-11-01 or 2026-11-01T12:00+00:00, got {text!r}"
        ) from None
    return value if value.tzinfo else timezone.make_aware(value, timezone.get_fixed_timezone(0))


def restore(cmd, o):
    """``restore RUN_KEY …`` requests; ``restore approve ID`` approves (then restores);
    ``restore resume ID`` carries on an approved restore that was interrupted."""
    what, ident = o["what"], o.get("id")
    actor = _actor(o)
    if what in ("approve", "resume"):
        request = RestoreRequest.objects.filter(pk=as_id(ident) or 0).first() if ident else None
        if request is None:
            raise CommandError(f"unknown restore #{ident}")
        if what == "approve":
            request = restores.approve_restore(request, actor=actor, reason=o["reason"] or "")
            cmd.stdout.write(
                f"restore #{request.pk} approved by {request.approved_by} (requested by "
                f"{request.requested_by}): restoring {request.scope()} of {request.run.run_key}"
            )
        rows = restores.carry_out(request)
        cmd.stdout.write(
            f"restore #{request.pk}: {rows} row(s) put back into {request.run.policy_version.parsed.qualified_table}"
        )
        return
    if ident is not None:
        raise CommandError("usage: restore RUN_KEY --reason …, restore approve ID --reason …")
    run = _run(what)
    request = restores.request_restore(
        run,
        actor=actor,
        reason=o["reason"] or "",
        tenant=o.get("tenant"),
        time_from=_instant(o.get("time_from"), "--from"),
        time_to=_instant(o.get("time_to"), "--to"),
    )
    cmd.stdout.write(
        f"restore #{request.pk} requested by {actor.username}: {request.scope()} of "
        f"{run.run_key} ({archived_rows(run.pk)} rows archived); another member of compliance "
        f"approves it (retention restore approve {request.pk} --reason …)"
    )


def _verify_targets(cmd) -> list[str]:
    """Every other target's audit chain (and the operator log its engine wrote there), each
    verified on its own database and against its latest checkpoint (stored in the control
    database, read here first); a target that does not answer is a problem, named."""
    problems: list[str] = []
    for name in fleet_connections.all_names():
        if name == fleet_connections.DEFAULT:
            continue
        checkpoint = evidence.latest_checkpoint(name)
        try:
            with fleet_connections.on(name):
                report, log = verify_chain(), verify_operator_log()
                anchored = evidence.check_stored(checkpoint) if checkpoint else []
        except Exception as exc:  # noqa: BLE001 - any failure to read a chain is reported
            problems.append(f"target {name}: not verified: {fleet_connections.first_line(exc)}")
            continue
        finally:
            fleet_connections.close_all()
        found = [*report.problems, *log.problems, *anchored]
        problems.extend(f"target {name}: {p}" for p in found)
        if not found:
            anchor = (
                f"; holds checkpoint #{checkpoint.pk} (audit record {checkpoint.audit_seq})"
                if checkpoint
                else "; no signed checkpoint of it yet"
            )
            cmd.stdout.write(
                f"target {name}: audit chain intact: {report.records} record(s), head "
                f"{report.head}; operator log intact: {log.records} action(s){anchor}"
            )
    return problems


def audit_verify(cmd, o):
    report, log = verify_chain(), verify_operator_log()
    problems = [*report.problems, *log.problems, *_verify_targets(cmd)]
    # people written behind the product's back (core.seals): they sign in nowhere, and are named
    problems.extend(
        f"account {who}: its seal does not match — created or changed outside the product"
        for who in broken_seals()
    )
    # decisions and a person's operator-log rows without a signature that verifies
    # (signatures/, retention.decisions): written with a database login alone
    problems.extend(unverified_decisions())
    problems.extend(unsigned_actions())
    # checkpoints stored without the checkpoint job's key (the monitor login may insert)
    problems.extend(evidence.unverified_checkpoints())
    for path in o.get("against") or []:
        problems.extend(evidence.check(path))
    checked = None
    if o.get("archives"):  # re-read every archive object the chain names
        checked, found = archives.verify_objects()
        problems.extend(found)
    if not problems:
        anchored = f", {len(o['against'])} anchor(s) hold" if o.get("against") else ""
        if checked is not None:
            anchored += f", {checked} archive object(s) match their digests"
        cmd.stdout.write(
            f"audit chain intact: {report.records} record(s), head {report.head}; "
            f"operator log intact: {log.records} action(s), head {log.head}{anchored}"
        )
        return
    for problem in problems:
        cmd.stderr.write(problem)
    raise CommandError(
        f"audit chain broken: {len(problems)} problem(s) in {report.records} record(s) "
        f"and {log.records} operator action(s)"
    )


def audit_checkpoint(cmd, o):
    """The checkpoint job: sign both chains' heads of the control database and of every
    target, store the anchors (in the control database: every manifest carries the latest),
    and print or write them for an auditor to keep. A target that does not answer is named
    and makes the job fail, after the others are signed."""
    try:
        checkpoint = evidence.take_checkpoint()
    except evidence.NoEvidenceKey as exc:
        raise CommandError(str(exc)) from None
    taken, missed = [checkpoint], []
    for name in fleet_connections.all_names():
        if name == fleet_connections.DEFAULT:
            continue
        try:
            taken.append(evidence.take_target_checkpoint(name))
        except Exception as exc:  # noqa: BLE001 - a target that does not answer, one line
            missed.append(f"target {name}: not checkpointed: {fleet_connections.first_line(exc)}")
        finally:
            fleet_connections.close_all()
    documents = [evidence.document(c) for c in taken]
    if len(documents) == 1 and not missed:
        text = json.dumps(documents[0], indent=1) + "\n"
    else:  # a fleet: the control database's anchor first, then each target's
        text = json.dumps({"anchors": documents}, indent=1) + "\n"
    cmd.stderr.write(
        f"public key (RETENTION_EVIDENCE_PUBLIC_KEY of the web and worker hosts): "
        f"{evidence.public_key_hex()}"
    )
    if o.get("out"):
        Path(o["out"]).write_text(text)
        cmd.stdout.write(
            f"checkpoint #{checkpoint.pk} written to {o['out']}: audit record "
            f"{checkpoint.audit_seq}, operator action {checkpoint.operator_seq}"
        )
        for c in taken[1:]:
            cmd.stdout.write(
                f"checkpoint #{c.pk} of target {c.target}: audit record {c.audit_seq}, "
                f"operator action {c.operator_seq}"
            )
    else:
        cmd.stdout.write(text, ending="")
    if missed:
        for line in missed:
            cmd.stderr.write(line)
        raise CommandError(
            f"{len(missed)} target(s) not checkpointed (above); the others are signed and stored"
        )


def explain(cmd, o):
    policy = _policy(o["slug"])
    cmd.stdout.write(f"== {explain_chunking(policy)}")
    cmd.stdout.write(f"== {explain_cutoff(policy)}")
    for title, lines in explain_policy(policy):
        cmd.stdout.write(f"== {title}")
        for line in lines:
            cmd.stdout.write(f"   {line}")


def register(areas) -> None:
    """Add this app's sub-commands to the ``retention`` command's sub-parsers."""

    def add(name, handler, help_text):
        parser = areas.add_parser(name, help=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = add(
        "trigger", trigger, "create (or find) the run of a policy for a period; prints the run key"
    )
    p.add_argument("slug")
    p.add_argument("--period", help="YYYY-MM-DD or YYYY-MM-DDTHH:MM in the policy's timezone")
    p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")

    p = add("runs", runs_list, "the latest runs, newest first")
    p.add_argument("--policy", metavar="SLUG")
    p.add_argument("--state", help="active, paused, attention, drained, counted, …")
    p.add_argument("--limit", type=int, default=50)

    p = add("status", status, "state and progress of a run")
    p.add_argument("run_key")
    p.add_argument("--json", action="store_true")

    p = add("drain", drain, "run the worker in this process")
    p.add_argument("run_key", nargs="?")
    p.add_argument(
        "--until-idle", action="store_true", help="keep going until no active run has work"
    )
    p.add_argument("--budget", type=float, default=30.0, help="seconds per run per round")
    p.add_argument("--workers", type=int, default=1, help="workers, as threads of this process")

    for name, action, text in (
        ("pause", "pause_run", "stop admitting chunks of a run"),
        ("resume", "resume_run", "resume a paused run"),
        ("cancel", "cancel_run", "end a run; pending chunks are cancelled"),
        ("confirm", "confirm_run", "start a run held for blast-radius confirmation"),
        ("retry", "retry_run", "replay a run's dead letters of a run-level cause and resume it"),
    ):
        p = add(name, _control(action), text)
        p.add_argument("run_key")
        p.add_argument("--reason", required=True)
        p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")

    for name, handler, text in (
        ("replay", replay, "replay dead letters: ids, or --all matching (--run, --cause, --table)"),
        (
            "discard",
            discard,
            "discard dead letters: ids, or --all matching (--run, --cause, --table)",
        ),
    ):
        p = add(name, handler, text)
        p.add_argument("ids", type=int, nargs="*", metavar="ID")
        p.add_argument("--all", action="store_true", help="every open dead letter matching")
        p.add_argument("--run", metavar="RUN", help="with --all: of this run (key or id)")
        p.add_argument("--cause", help="with --all: a SQLSTATE (42703) or a whole cause")
        p.add_argument("--table", help="with --all: of this table (orders or public.orders)")
        p.add_argument("--policy", metavar="SLUG", help="with --all: of this policy")
        p.add_argument("--reason", required=True)
        p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")

    p = add("dead-letters", dead_letters, "list open dead letters (of a run), with their ids")
    p.add_argument("run_key", nargs="?", metavar="RUN")
    p.add_argument("--all", action="store_true", help="replayed and discarded ones too")
    p.add_argument("--cause", help="a SQLSTATE (42703)")
    p.add_argument("--table", help="orders or public.orders")
    p.add_argument("--policy", metavar="SLUG")

    p = add("kill-switch", kill_switch, "the global kill switch")
    p.add_argument("state", choices=["on", "off"])
    p.add_argument("--reason", required=True)
    p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")

    p = add(
        "evidence",
        evidence_files,
        "write a run's audit CSV and evidence manifest to files, or a policy's period's "
        "manifest over every target (--policy SLUG --period P --manifest FILE)",
    )
    p.add_argument("run_key", metavar="RUN", nargs="?")
    p.add_argument("--policy", metavar="SLUG", help="a policy's period over every target")
    p.add_argument(
        "--period", help="with --policy: YYYY-MM-DD or YYYY-MM-DDTHH:MM (default: latest)"
    )
    p.add_argument("--csv", metavar="FILE")
    p.add_argument("--manifest", metavar="FILE")

    add("reconcile", reconcile, "one reconciler pass now")
    p = add(
        "explain",
        explain,
        "EXPLAIN (ANALYZE, BUFFERS) of the engine's statements on a policy's table",
    )
    p.add_argument("slug")
    add("startup", startup, "arm schedules; start a first run for policies that never ran")
    p = add(
        "restore",
        restore,
        "put a run's archived rows back: RUN_KEY requests, 'approve ID' approves and restores, "
        "'resume ID' carries on an interrupted restore",
    )
    p.add_argument("what", metavar="RUN_KEY|approve|resume")
    p.add_argument("id", nargs="?", help="the restore's number (approve, resume)")
    p.add_argument("--tenant", help="only this tenant's rows")
    p.add_argument("--from", dest="time_from", help="only rows whose timestamp is at or after this")
    p.add_argument("--to", dest="time_to", help="only rows whose timestamp is before this")
    p.add_argument("--reason", help="required to request and to approve")
    p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")
    audit = areas.add_parser("audit", help="audit trail")
    audit_sub = audit.add_subparsers(dest="audit_cmd", required=True)
    v = audit_sub.add_parser(
        "verify", help="check the audit chain and the operator log (and signed anchors)"
    )
    v.add_argument(
        "--against",
        nargs="+",
        metavar="FILE",
        help="run manifests or checkpoints kept outside the database",
    )
    v.add_argument(
        "--archives",
        action="store_true",
        help="also re-read every archive object the chain names and check its SHA-256 and rows",
    )
    v.set_defaults(handler=audit_verify)
    c = audit_sub.add_parser(
        "checkpoint",
        help="sign both chains' heads and store the anchor (the checkpoint job; needs "
        "RETENTION_EVIDENCE_KEY); print it or write it to FILE",
    )
    c.add_argument("--out", metavar="FILE", help="write it to FILE (default: stdout)")
    c.set_defaults(handler=audit_checkpoint)
