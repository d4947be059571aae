"""``python manage.py …`` for the tests, without paying for its imports each time.

A command started with ``subprocess.run([sys.executable, "manage.py", …])`` spends about half
its CPU importing third-party packages (Django, psycopg, pydantic, cryptography …) before it
does anything. ``run`` starts each such command instead as a fork of a *zygote*: one Python per
test process, started on first use, that has imported those packages and nothing else — not
``config.settings`` nor any of the product's modules, which read the environment when imported
and each command brings its own. The child then does what the interpreter would: takes the
command's environment, working directory and ``argv``, its stdin, stdout and stderr, runs the
script as ``__main__`` and exits with its status. It is still a real, separate process with its
own exit code and output; only the imports are shared. ``start`` starts one that runs beside
the test (a worker draining while the test watches it) and returns at once.

Fork-safety: the zygote never opens a database connection nor starts a thread (it checks before
each fork), so a child inherits no session, lock or half-held mutex. A command whose interpreter
would start differently (another Python, other ``PYTHON*`` or locale variables) is started the
ordinary way, as is everything a test is about as a process (crashes, signals, process groups:
``tests.runs.processes.spawn``). ``RETENTION_TEST_ZYGOTE=0`` starts every command the ordinary
way (to compare).

``run(…, django=True)``: the same, from a zygote that has also set Django up
(``django.setup()``: the settings, every app's models) with the command's own environment — a
second zygote, kept while the commands asked of it have that environment, but for the
variables a command reads only once it runs (``COMMAND_TIME``: whose token it acts with).
For commands run again and again with one configuration (the command line both ways); each
is still a process of its own, with the configuration it would have read itself."""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import types
import uuid

# What a ``manage.py`` start imports before the project, that imports without settings and
# starts no thread (pyarrow starts jemalloc's background thread: not here; django_q, ninja and
# axes read settings when imported: not here either).
PRELOAD = """
    argparse asyncio csv decimal difflib email.mime.text email.utils getpass hashlib hmac json
    logging.config multiprocessing pydoc runpy secrets shutil socket ssl subprocess tarfile
    tempfile tomllib unittest.mock uuid xml.dom.minidom xml.etree.ElementTree zipfile zoneinfo
    asgiref.sync django django.contrib.admin.options django.contrib.auth.hashers
    django.contrib.auth.password_validation django.contrib.messages.storage.fallback
    django.contrib.postgres.constraints django.contrib.postgres.fields
    django.contrib.postgres.indexes django.contrib.postgres.search
    django.contrib.sessions.backends.db django.contrib.staticfiles.finders
    django.contrib.staticfiles.storage django.core.cache.backends.db django.core.checks
    django.core.handlers.wsgi django.core.management django.core.management.base
    django.core.management.commands.migrate django.core.serializers.json django.core.wsgi
    django.db.backends.postgresql.base django.db.backends.postgresql.features
    django.db.backends.postgresql.introspection django.db.backends.postgresql.operations
    django.db.backends.postgresql.schema django.db.migrations django.db.models django.forms
    django.http django.middleware.csrf django.middleware.security django.template.defaulttags
    django.template.loader django.template.loader_tags django.templatetags.i18n django.test
    django.test.client django.test.utils django.urls django.utils.timezone
    django.utils.translation.trans_real django.views.debug django.views.generic
    django.views.static annotated_types croniter cryptography.hazmat.bindings.openssl.binding
    cryptography.hazmat.primitives.asymmetric.ed25519 cryptography.hazmat.primitives.hashes
    cryptography.hazmat.primitives.serialization dateutil.parser dateutil.tz django_htmx.middleware
    picklefield prometheus_client psutil psycopg psycopg.sql psycopg.types.json psycopg_binary
    pydantic pydantic.fields pydantic.functional_validators pydantic.json_schema pydantic.main
    pydantic.networks pydantic.types pydantic_core sqlparse tomli_w typing_extensions
    whitenoise.middleware
""".split()

# Variables the interpreter reads as it starts: a command whose values differ from the
# zygote's would not start as the zygote did, so it is started the ordinary way.
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_NAMES = ("LANG", "LANGUAGE")

_HEADER = struct.Struct("!I")

# Variables the product reads when a command runs, never while Django is set up (the settings
# do not read them): a zygote that set Django up serves commands that differ from it in these.
COMMAND_TIME = ("RETENTION_TOKEN",)


def _startup(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


# --- the zygote (its own process) -------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _serve(listener: socket.socket) -> dict:
    """Accept requests until the test process goes away; fork a child per request. Returns
    only in a child, with its request, its standard streams already in place."""
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    while True:
        for key, _ in selector.select():
            if key.data == "parent":  # EOF: the test process is gone, and so are we
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        with contextlib.suppress(OSError):
                            conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                        conn.close()
                continue
            conn, _ = listener.accept()
            conn.setblocking(True)
            size = _HEADER.unpack(conn.recv(_HEADER.size, socket.MSG_WAITALL))[0]
            payload, fds, _, _ = socket.recv_fds(conn, size, 3, socket.MSG_WAITALL)
            if _threads() != 1:
                conn.sendall(b"refused: the zygote has started a thread\n")
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                conn.close()
                for other in children.values():  # the other commands' replies are not its own
                    other.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return json.loads(payload)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(f"pid {pid}\n".encode())


def _become(request: dict) -> str | list[str]:
    """In the child: the command's environment, directory and argv, as the interpreter would
    have set them up for ``python SCRIPT ARGS`` (or ``python -c CODE ARGS``); returns the script
    (or ``["-c", CODE]``). Its standard streams are already the command's (file descriptors 0-2), under the zygote's own stream objects, which
    read and write them as a fresh interpreter's would: nothing was ever read or written
    through them."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = list(request["argv"])
    if argv[0] == "-c":  # ``python -c CODE ARGS``: argv ["-c", ARGS], the working directory first
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        return argv[0:2]
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    return argv[0]


# What a zygote that sets Django up imports besides: the URLconf (the API, the pages and what
# they import, read by the system checks every command runs) and these commands' modules.
DJANGO_COMMANDS = ("retention",)
# pyarrow (imported by the product) starts jemalloc's background thread and numpy's OpenBLAS
# its pool: a zygote is fork-safe with one thread only, so these import without them. Its
# children free memory without jemalloc's background purge and run BLAS on one thread; nothing
# the product does depends on either.
NO_THREADS = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "OPENBLAS_NUM_THREADS": "1"}


def _set_django_up() -> None:
    """``django.setup()`` as ``manage.py`` would in this directory, with this environment, and
    the product's modules a command imports; nothing a child could share: no database
    session, no thread."""
    sys.path[0] = os.getcwd()  # as for ``python manage.py``: the project first, not tests/
    import django
    from django.conf import settings
    from django.core.management import get_commands, load_command_class
    from django.db import connections

    django.setup()
    for name, value in NO_THREADS.items():
        os.environ.setdefault(name, value)
    importlib.import_module(settings.ROOT_URLCONF)
    for command in DJANGO_COMMANDS:
        load_command_class(get_commands()[command], command)
    opened = [c.alias for c in connections.all(initialized_only=True) if c.connection is not None]
    if opened:
        sys.exit(f"zygote: django.setup() opened a database session ({opened})")


def _main() -> None:
    listener = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        importlib.import_module(name)
    if sys.argv[2:] == ["--django"]:
        _set_django_up()
    if _threads() != 1:
        sys.exit(f"zygote: a preloaded module started a thread ({_threads()} threads)")
    import gc

    gc.freeze()  # what is imported stays shared with the children, page for page
    try:
        request = _serve(listener)
    except KeyboardInterrupt:
        os._exit(1)
    # a child: run the script as the interpreter runs ``python SCRIPT``
    script = _become(request)
    if isinstance(script, list):
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(script[1], "<string>", "exec"), main.__dict__)
    else:
        runpy.run_path(script, run_name="__main__")


# --- the test process's side ------------------------------------------------------------------


def _settings_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in COMMAND_TIME}


class _Zygote:
    def __init__(self, django: tuple[dict, str] | None = None) -> None:
        """``django``: (environment, directory) to set Django up with; None: nothing of it."""
        self.address = f"\0retention-zygote-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address)
        listener.listen(64)
        if django is None:
            env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
            cwd, extra = "/", []
        else:
            env, cwd = _settings_env(django[0]), django[1]
            env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
            extra = ["--django"]
        self.django = None if django is None else (env, cwd)
        self.startup = _startup(env)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(listener.fileno()), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, pass_fds=[listener.fileno()],
            cwd=cwd,
        )  # fmt: skip
        listener.close()
        self.pid = os.getpid()

    def usable_for(self, env: dict, cwd=None) -> bool:
        usable = (
            self.pid == os.getpid()
            and self.process.poll() is None
            and _startup(env) == self.startup
        )
        if self.django is None or not usable:
            return usable
        settings_env, directory = self.django
        wanted = _settings_env(env)
        wanted.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        return wanted == settings_env and str(cwd) == directory

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def start(self, argv, *, cwd, env, fds) -> tuple[_Replies, int]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.address)
        payload = json.dumps({"argv": list(argv), "cwd": str(cwd), "env": env}).encode()
        conn.sendall(_HEADER.pack(len(payload)))
        socket.send_fds(conn, [payload], fds)
        replies = _Replies(conn)
        reply = replies.line()
        if not reply.startswith("pid "):
            conn.close()
            raise RuntimeError(f"zygote: {reply.strip() or 'no answer'}")
        return replies, int(reply.split()[1])


class _Replies:
    """The zygote's lines about one command: ``pid N``, then ``exit STATUS``."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def line(self, timeout: float | None = None) -> str:
        self.conn.settimeout(timeout)
        while b"\n" not in self.buffer:
            data = self.conn.recv(4096)
            if not data:
                break
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        self.conn.close()


_zygote: _Zygote | None = None
_django_zygote: _Zygote | None = None
_lock = threading.Lock()


def _get() -> _Zygote:
    global _zygote
    with _lock:
        if _zygote is None or _zygote.pid != os.getpid() or _zygote.process.poll() is not None:
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        return _zygote


def _get_django(env: dict, cwd) -> _Zygote:
    """The zygote that set Django up with ``env`` in ``cwd``: the one kept if it did, else a
    new one in its place."""
    global _django_zygote
    with _lock:
        kept = _django_zygote
        if kept is not None and kept.usable_for(env, cwd):
            return kept
        if kept is not None and kept.pid == os.getpid():
            kept.close()
        _django_zygote = _Zygote(django=(env, str(cwd)))
        atexit.register(_django_zygote.close)
        return _django_zygote


def _decode(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` reads a child's output: the locale's encoding,
    universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(
    args,
    *,
    cwd,
    env: dict | None = None,
    input: str | None = None,
    timeout: float | None = None,
    django: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run(args, cwd=cwd, env=env, input=input, timeout=timeout,
    capture_output=True, text=True)`` for ``args = [sys.executable, SCRIPT, *ARGS]`` (or
    ``[sys.executable, "-c", CODE, *ARGS]``), started as
    a fork of the zygote (see the module's docstring); anything else the ordinary way. Without
    ``input`` the command's stdin is empty (/dev/null), never the test process's own.
    ``django``: forked from a zygote that set Django up with ``env`` (the module's docstring)."""
    args = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    script = len(args) >= 2 and args[1].endswith(".py") and not args[1].startswith("-")
    code = len(args) >= 3 and args[1] == "-c"
    ordinary = args[0] != sys.executable or not (script or code)
    ordinary = ordinary or os.environ.get("RETENTION_TEST_ZYGOTE") == "0"
    zygote = None if ordinary else _get_django(env, cwd) if django else _get()
    if zygote is None or not zygote.usable_for(env, cwd):
        return subprocess.run(
            args, cwd=cwd, env=env, input=input, timeout=timeout, capture_output=True, text=True,
            stdin=None if input is not None else subprocess.DEVNULL,
        )  # fmt: skip
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        if input is not None:
            stdin.write(input.encode(locale.getpreferredencoding(False)))
            stdin.seek(0)
            source = stdin.fileno()
        else:
            source = os.open(os.devnull, os.O_RDONLY)
        try:
            replies, pid = zygote.start(
                args[1:], cwd=cwd, env=env, fds=[source, stdout.fileno(), stderr.fileno()]
            )
        finally:
            if input is None:
                os.close(source)
        try:
            reply = replies.line(timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            replies.line(30)
            stdout.seek(0)
            stderr.seek(0)
            raise subprocess.TimeoutExpired(
                args, timeout, output=_decode(stdout.read()), stderr=_decode(stderr.read())
            ) from None
        finally:
            replies.close()
        if not reply.startswith("exit "):
            raise RuntimeError(f"zygote: no exit status for {args[1:]} (pid {pid}): {reply!r}")
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(
            args, int(reply.split()[1]), _decode(stdout.read()), _decode(stderr.read())
        )


class Started:
    """A command running beside the test (``start``): ``pid``, ``kill()`` (SIGKILL, unless it
    has already exited) and ``wait(timeout)`` → its exit status, as ``subprocess.Popen``."""

    def __init__(self, replies: _Replies | None, pid: int, popen=None) -> None:
        self.replies, self.pid, self.popen = replies, pid, popen
        self.returncode: int | None = None

    def _exited(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        if self.returncode is not None:
            return True
        ready = selectors.DefaultSelector()
        ready.register(self.replies.conn, selectors.EVENT_READ)
        try:
            return bool(ready.select(0))  # its exit line, or the zygote gone
        finally:
            ready.close()

    def kill(self) -> None:
        if self._exited():  # its pid may be another process's by now
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.popen is not None:
            return self.popen.wait(timeout)
        if self.returncode is None:
            reply = self.replies.line(timeout)
            self.replies.close()
            if not reply.startswith("exit "):
                raise RuntimeError(f"zygote: no exit status for pid {self.pid}: {reply!r}")
            self.returncode = int(reply.split()[1])
        return self.returncode


def start(args, *, cwd, env: dict | None = None, stdout) -> Started:
    """``subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.STDOUT,
    stdin=subprocess.DEVNULL)`` for a long-running command (a worker beside the test), started
    as a fork of the zygote as ``run`` starts one; ``stdout``: an open file."""
    args = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    script = len(args) >= 2 and args[1].endswith(".py") and not args[1].startswith("-")
    ordinary = args[0] != sys.executable or not script
    ordinary = ordinary or os.environ.get("RETENTION_TEST_ZYGOTE") == "0"
    zygote = None if ordinary else _get()
    if zygote is None or not zygote.usable_for(env):
        popen = subprocess.Popen(
            args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        return Started(None, popen.pid, popen)
    source = os.open(os.devnull, os.O_RDONLY)
    try:
        replies, pid = zygote.start(
            args[1:], cwd=cwd, env=env, fds=[source, stdout.fileno(), stdout.fileno()]
        )
    finally:
        os.close(source)
    return Started(replies, pid)


if __name__ == "__main__":
    _main()
