"""The tests' zygote (tests/zygote.py) starts a command as a real process of its own, with the
command's environment, directory, arguments, input, output and exit status, and stays
fork-safe: one thread, no database session, nothing of the product imported; the zygote that
sets Django up serves the commands of its configuration only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests import zygote

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    data = sys.stdin.read()
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
        "path0": sys.path[0], "stdin": data, "colour": os.environ.get("COLOUR"),
        "settings": os.environ.get("DJANGO_SETTINGS_MODULE"),
        "product": sorted(m for m in sys.modules if m.split(".")[0] in
                          ("config", "core", "retention", "runs", "tests")),
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def test_a_command_is_a_process_of_its_own_with_its_environment_input_and_status(script, tmp_path):
    env = dict(os.environ, COLOUR="blue", DJANGO_SETTINGS_MODULE="config.settings")
    done = zygote.run([sys.executable, str(script), "3"], cwd=tmp_path, env=env, input="hi\n")
    assert done.returncode == 3
    assert done.stderr == "to stderr\n"
    seen = json.loads(done.stdout)
    assert seen["pid"] not in (os.getpid(), zygote._get().process.pid)
    assert seen["ppid"] == zygote._get().process.pid  # forked, not started by this process
    assert seen["cwd"] == str(tmp_path)
    assert seen["argv"] == [str(script), "3"]
    assert seen["path0"] == str(tmp_path)  # as ``python SCRIPT`` puts the script's folder first
    assert seen["stdin"] == "hi\n"
    assert (seen["colour"], seen["settings"]) == ("blue", "config.settings")
    assert seen["product"] == []  # the zygote imported nothing of the product (nor the tests)
    # no input: an empty stdin, never the test process's own
    assert (
        json.loads(zygote.run([sys.executable, str(script), "0"], cwd=tmp_path).stdout)["stdin"]
        == ""
    )


def test_python_dash_c_runs_its_code_as_main_with_its_arguments(tmp_path):
    code = "import sys; print(__name__, sys.argv, repr(sys.path[0]), sys.stdin.read()); sys.exit(5)"
    done = zygote.run([sys.executable, "-c", code, "x"], cwd=tmp_path, input="in")
    ordinary = subprocess.run(
        [sys.executable, "-c", code, "x"], cwd=tmp_path, input="in", capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (ordinary.returncode, ordinary.stdout)
    assert done.stdout == "__main__ ['-c', 'x'] '' in\n"


def test_the_zygote_keeps_one_thread_and_no_connection(script, tmp_path):
    zygote.run([sys.executable, str(script), "0"], cwd=tmp_path)
    process = psutil.Process(zygote._get().process.pid)
    assert process.num_threads() == 1
    # its listening socket only: no database session, nothing a child could share
    assert [c.status for c in process.net_connections("all")] == [psutil.CONN_NONE]


def test_a_command_the_zygote_would_start_differently_is_started_the_ordinary_way(script, tmp_path):
    env = dict(os.environ, PYTHONHASHSEED="7")
    seen = json.loads(zygote.run([sys.executable, str(script), "0"], cwd=tmp_path, env=env).stdout)
    assert seen["ppid"] == os.getpid()


def test_a_command_past_its_timeout_is_killed(tmp_path):
    path = tmp_path / "sleeps.py"
    path.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        zygote.run([sys.executable, str(path)], cwd=tmp_path, timeout=2)
    assert not psutil.pid_exists(int(timed_out.value.output))  # killed, and reaped


def test_a_command_started_beside_the_test_writes_to_its_file_and_dies_when_killed(tmp_path):
    path = tmp_path / "sleeps.py"
    path.write_text(
        "import os, sys, time\nprint(os.getpid(), os.getppid(), flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\ntime.sleep(120)\n"
    )
    with open(tmp_path / "out.log", "w") as out:
        started = zygote.start([sys.executable, str(path)], cwd=tmp_path, stdout=out)
        deadline = time.monotonic() + 60
        while "to stderr" not in (tmp_path / "out.log").read_text():
            assert time.monotonic() < deadline, "no output from the command"
            time.sleep(0.05)
        pid, ppid = map(int, (tmp_path / "out.log").read_text().split("\n")[0].split())
        assert (pid, ppid) == (started.pid, zygote._get().process.pid)  # forked by the zygote
        started.kill()
        assert started.wait(timeout=30) == -9
        assert not psutil.pid_exists(started.pid)  # and reaped
        started.kill()  # once it has exited, a kill is a no-op: its pid may be another's


def test_a_command_started_beside_the_test_gives_its_exit_status(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(4)\n")
    with open(tmp_path / "out.log", "w") as out:
        started = zygote.start([sys.executable, str(path)], cwd=tmp_path, stdout=out)
        assert started.wait(timeout=60) == 4


DJANGO_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from django.conf import settings
    print(json.dumps({
        "ppid": os.getppid(), "token": os.environ.get("RETENTION_TOKEN"),
        "debug": settings.DEBUG, "threads": len(os.listdir("/proc/self/task")),
        "preloaded": [m for m in ("config.urls", "runs.management.commands.retention")
                      if m in sys.modules],
    }))
    """
)


def test_a_command_forked_after_django_set_up_reads_its_own_token_and_configuration(tmp_path):
    from django.conf import settings

    from tests.runs.conftest import ROOT

    base = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", RETENTION_DEMO="1")

    def probe(**env):
        done = zygote.run(
            [sys.executable, "-c", DJANGO_PROBE], cwd=ROOT, env=dict(base, **env), django=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = probe(DEBUG="0", RETENTION_TOKEN="rr_one")
    second = probe(DEBUG="0", RETENTION_TOKEN="rr_two")
    # one zygote for both (the token is read when a command runs), each child its own token
    assert first["ppid"] == second["ppid"] == zygote._django_zygote.process.pid
    assert (first["token"], second["token"]) == ("rr_one", "rr_two")
    assert first["debug"] is False and first["threads"] == 1
    assert first["preloaded"] == ["config.urls", "runs.management.commands.retention"]
    zygote_pid = first["ppid"]
    # a setting read while Django is set up: another zygote, set up with it
    other = probe(DEBUG="1", RETENTION_TOKEN="rr_one")
    assert other["debug"] is True and other["ppid"] != zygote_pid
    assert not psutil.pid_exists(zygote_pid)  # the first one is gone
    assert settings.configured  # (this process's own settings are untouched)


def test_the_zygote_that_set_django_up_keeps_one_thread_and_no_connection():
    from tests.runs.conftest import ROOT

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", RETENTION_DEMO="1")
    zygote.run([sys.executable, "-c", "pass"], cwd=ROOT, env=env, django=True)
    process = psutil.Process(zygote._django_zygote.process.pid)
    assert process.num_threads() == 1
    # its listening socket only: the command's connection, which the zygote closes just after
    # it has written the exit status, goes within moments; a database session would stay
    deadline = time.monotonic() + 30
    while (sockets := [c.status for c in process.net_connections("all")]) != [psutil.CONN_NONE]:
        assert time.monotonic() < deadline, sockets
        time.sleep(0.05)
