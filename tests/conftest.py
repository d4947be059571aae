"""Shared fixtures. Every test runs on real PostgreSQL (embedded unless DATABASE_URL is set)."""

from __future__ import annotations

import contextlib
import os

import pytest
from django.contrib.auth.models import Group, User

from core.roles import ALL_ROLES


def md5_passwords() -> None:
    """The suite's passwords are throwaway: hashed with MD5 in this process and every process
    it starts (a CLI, a worker, gunicorn), not with PBKDF2's half a second of CPU per hash and
    per sign-in (config/settings.py, ``RETENTION_TEST_MD5_PASSWORDS``). pytest-django has read
    the settings before this file is imported, so this process's are changed here too.
    tests/core/test_configuration.py checks the product's PBKDF2 where it is unset."""
    from django.conf import global_settings, settings
    from django.contrib.auth import hashers

    os.environ["RETENTION_TEST_MD5_PASSWORDS"] = "1"
    settings.TEST_MD5_PASSWORDS = True
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        *global_settings.PASSWORD_HASHERS,
    ]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


md5_passwords()


@pytest.fixture(scope="session")
def django_db_setup(
    request, django_test_environment, django_db_blocker, django_db_modify_db_settings
):
    """Each test process's database is a clone of one migrated template (tests/template_db.py)
    instead of a migration of its own; any further database alias is set up as Django does."""
    from django.test.utils import setup_databases, teardown_databases
    from pytest_django.fixtures import _get_databases_for_setup

    from tests import template_db

    aliases, serialized = _get_databases_for_setup(request.session.items)
    with django_db_blocker.unblock():
        name = template_db.clone_test_database("default")
        others = aliases - {"default"}
        config = (
            setup_databases(
                verbosity=0, interactive=False, aliases=others, serialized_aliases=serialized
            )
            if others
            else None
        )
    yield
    with django_db_blocker.unblock():
        if config:
            teardown_databases(config, verbosity=0)
        template_db.drop_test_database("default", name)


def create_user(username: str, *roles: str) -> User:
    """A user holding the given roles, whose password is ``<username>-pw``."""
    user = User.objects.create_user(username=username, password=f"{username}-pw")
    for role in roles:
        assert role in ALL_ROLES, role
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    return user


@pytest.fixture
def make_user(db):
    """``make_user("alice", "compliance")`` — a user holding the given roles."""
    return create_user


@pytest.fixture(scope="module")
def build_once(django_db_setup, django_db_blocker):
    """``build_once(build)`` in a module-scoped fixture: what ``build()`` returns, built once
    for the module's tests (the role matrices' world: people, policies, runs, tokens).

    The world stays in one transaction around the module's tests, rolled back after the last;
    each test's own transaction (``db``) is a savepoint inside it, rolled back after the test.
    So every test starts from the world as built and none sees another's writes. Model
    instances built here outlive the tests: a test reads them again (``fresh``) before it acts
    on one. Not for tests that commit (``transactional_db``, other processes reading the
    world): they see nothing of it."""
    from django.db import transaction

    outer = None

    def build(make):
        nonlocal outer
        assert outer is None, "one world per module"
        with django_db_blocker.unblock():
            outer = transaction.atomic()
            outer._from_testcase = True  # as TestCase's own: a durable block may open inside
            outer.__enter__()
            with guard_as_in_a_test():
                return make()

    yield build
    if outer is not None:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def fresh(value):
    """``value`` with each model instance in it (itself, a dict's values) read again from the
    database: what a test acts on is the row as it is now, not as an earlier test left the
    instance in memory."""
    from django.db.models import Model

    if isinstance(value, dict):
        return {key: fresh(item) for key, item in value.items()}
    if isinstance(value, Model):
        return type(value)._default_manager.get(pk=value.pk)
    return value


@pytest.fixture(autouse=True)
def no_probe_session_left(settings):
    """The guard's probe keeps a session per thread (runs.engine.guard): none outlives a test.
    A drain in the test's own process samples at its admissions only: the sampler thread that
    a worker process keeps beside its chunks (``guard.sample_beside``) would write committed
    samples behind the test's back and outlive it. The tests of that thread turn it on, and
    worker processes a test starts have it as deployed."""
    settings.RETENTION = {**settings.RETENTION, "GUARD_SAMPLER_THREAD": False}
    yield
    # the product's modules: importable once pytest-django has set Django up
    from runs.engine import guard

    guard.stop_sampling_beside()
    guard.close_probe_connection()
    guard.forget_readings()  # keyed by policy id, which a later test's policy may reuse


PINNED_PROBE_MS = "1.0"
# Files whose every test is about the guard (a test elsewhere says so with @pytest.mark.guard).
GUARD_TEST_FILES = ("tests/runs/test_guard", "tests/dashboard/test_guard", "tests/load/")


# Tests whose behaviour depends on the PostgreSQL server's version: roles and grants, the
# SECURITY DEFINER functions, partitions (and pg_partman), the catalog the guard and the
# planner read, collations and key types, real projects' DDL. CI runs these against every
# supported server (the machine's PostgreSQL 15 beside the embedded one); the rest once.
SERVER_VERSION_PATHS = (
    "tests/security/",
    "tests/deploy/",
    "tests/realschemas/",
    "tests/runs/test_partition",
    "tests/runs/test_rollout_partitions.py",
    "tests/runs/test_guard.py",
    "tests/runs/test_guard_sampler.py",
    "tests/runs/test_table_shapes.py",
    "tests/runs/test_any_key.py",
    "tests/runs/test_cascades.py",
    "tests/runs/test_epoch_and_date_columns.py",
    "tests/runs/test_null_columns.py",
    "tests/runs/test_geometry.py",
    "tests/retention/test_validate_spec.py",
    "tests/retention/test_hold_tenant_types.py",
    "tests/core/test_configuration.py",
)


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath) + "/"
    for item in items:
        path = str(item.path).removeprefix(root)
        if path.startswith(GUARD_TEST_FILES):
            item.add_marker(pytest.mark.guard)
        if path.startswith(SERVER_VERSION_PATHS):
            item.add_marker(pytest.mark.server_version)


@pytest.fixture(autouse=True)
def pinned_guard_readings(request, settings, monkeypatch):
    """A test decides the guard's inputs, not the machine: unless it is about the guard (marker
    ``guard``), the guard's probe reads a fixed 1 ms and the signals other sessions of the
    server make read as calm (``RETENTION_GUARD_PINNED_PROBE_MS``), in this process and in
    every worker process it starts. The guard still samples, judges, paces and records each
    decision on the real database; only what it reads no longer depends on how busy the
    machine is. Tests about the guard make their own load and judge against a baseline they
    measured."""
    if request.node.get_closest_marker("guard"):
        monkeypatch.delenv("RETENTION_GUARD_PINNED_PROBE_MS", raising=False)
        settings.RETENTION = {**settings.RETENTION, "GUARD_PINNED_PROBE_MS": None}
        return
    monkeypatch.setenv("RETENTION_GUARD_PINNED_PROBE_MS", PINNED_PROBE_MS)
    settings.RETENTION = {**settings.RETENTION, "GUARD_PINNED_PROBE_MS": float(PINNED_PROBE_MS)}


@contextlib.contextmanager
def guard_as_in_a_test():
    """The guard as a test that is not about it has it (``no_probe_session_left``,
    ``pinned_guard_readings``, ``no_remembered_decisions``), for work done outside any one test:
    a world ``build_once`` builds."""
    from django.conf import settings
    from django.test import override_settings

    from retention import decisions
    from runs.engine import guard

    retention = {
        **settings.RETENTION,
        "GUARD_SAMPLER_THREAD": False,
        "GUARD_PINNED_PROBE_MS": float(PINNED_PROBE_MS),
    }
    env = os.environ.get("RETENTION_GUARD_PINNED_PROBE_MS")
    os.environ["RETENTION_GUARD_PINNED_PROBE_MS"] = PINNED_PROBE_MS
    try:
        with override_settings(RETENTION=retention):
            yield
    finally:
        if env is None:
            del os.environ["RETENTION_GUARD_PINNED_PROBE_MS"]
        else:
            os.environ["RETENTION_GUARD_PINNED_PROBE_MS"] = env
        guard.stop_sampling_beside()
        guard.close_probe_connection()
        guard.forget_readings()
        decisions.forget()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the test process (tests/browser.py); each test opens contexts
    of its own (``login``), so no cookie, storage or page outlives the test that made it."""
    from pathlib import Path

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs a loop
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def login(browser, live_server, users):
    """``login("oncall")`` → a page (nothing loaded yet) whose browser is signed in as that
    role's user (``user=`` another), in a window ``width`` pixels wide."""
    from tests.browser import session_cookie

    contexts = []

    def open_as(role: str, user=None, width: int = 1400):
        user = user or users[role]
        context = browser.new_context(
            viewport={"width": width, "height": 1000}, accept_downloads=True
        )
        contexts.append(context)
        context.add_cookies([session_cookie(user, live_server.url)])
        return context.new_page()

    yield open_as
    for context in contexts:
        context.close()


@pytest.fixture(autouse=True)
def live_server_requests_end_with_the_test(request):
    """A test that uses the live server: when it ends, the server refuses new requests and its
    requests in flight finish before the database is emptied (tests/live_server_gate.py), so a
    page still polling cannot deadlock the flush. Set up after the test's database, so torn down
    before it."""
    if "live_server" not in request.fixturenames:
        yield
        return
    from tests.live_server_gate import LiveServerGate

    request.getfixturevalue("transactional_db")
    gate = LiveServerGate.around(request.getfixturevalue("live_server"))
    gate.open()
    yield
    gate.close_and_wait()


@pytest.fixture(autouse=True)
def no_remembered_decisions():
    """No test inherits the approvals and hold releases an earlier one saw verify (ids may be
    used again after a flush)."""
    from retention import decisions  # the app registry is ready only once pytest-django ran

    decisions.forget()
    yield
    decisions.forget()


@pytest.fixture(autouse=True)
def no_cli_identity(monkeypatch):
    """No test inherits a CLI identity, and whatever one sets is undone after it."""
    monkeypatch.setenv("RETENTION_TOKEN", "")
    monkeypatch.delenv("RETENTION_TOKEN")


def token_for_claim(args) -> None:
    """Before a CLI call in a test: act as the user its ``--author``/``--approver``/``--by``
    names (a fresh personal token of theirs in ``RETENTION_TOKEN``), so the flag and the
    credential agree. No such user: no token, and the command is refused for that."""
    from core.models import ApiToken

    args = list(args)
    os.environ.pop("RETENTION_TOKEN", None)
    for flag in ("--author", "--approver", "--by"):
        if flag in args[:-1]:
            user = User.objects.filter(username=args[args.index(flag) + 1]).first()
            if user is not None:
                secret = f"{ApiToken.PREFIX}test-{user.pk}-{ApiToken.objects.count()}"
                ApiToken.objects.create(
                    user=user, name="tests", prefix=secret[:12], digest=ApiToken.digest_of(secret)
                )
                os.environ["RETENTION_TOKEN"] = secret
            return


@pytest.fixture
def act_as(monkeypatch):
    """``act_as(user)`` — CLI commands (in this process and in child processes started
    from it) act as ``user``: a personal API token of theirs in ``RETENTION_TOKEN``."""
    from core.tokens import create_token

    def use(user) -> str:
        _, secret = create_token(user, name="tests")
        monkeypatch.setenv("RETENTION_TOKEN", secret)
        return secret

    yield use


@pytest.fixture
def no_guard(settings):
    """The admission guard off, for tests about something else: their drains must finish
    whatever a busy machine does to the guard's probe (the guard's own tests leave it on)."""
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` takes the longest files first (tests/file_order.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.file_order import LongestFileFirst

    return LongestFileFirst(config, log)


# Rows every flush would put back as they were: the content types and permissions Django's
# post_migrate recreates (about 150 queries after each transactional test). Nothing in the suite
# writes them; the rest of the tables are emptied as Django's flush does.
KEPT_BY_FLUSH = frozenset({"django_content_type", "auth_permission"})


@pytest.fixture(autouse=True, scope="session")
def flush_keeps_the_catalog_of_models():
    """After a transactional test, every table but ``KEPT_BY_FLUSH`` is truncated, as Django's
    ``flush`` does, and the product's own post_migrate data comes back (its role groups, the
    reconciler's schedule), without Django's content types and permissions recreated from
    scratch each time."""
    from django.core.management.color import no_style
    from django.db import connections
    from django.test import TransactionTestCase

    from core.apps import ensure_role_groups
    from runs.engine.schedules import ensure_system_schedules

    original = TransactionTestCase._fixture_teardown

    def flush(self):
        if self.available_apps is not None or self.serialized_rollback:
            return original(self)
        for alias in self._databases_names(include_mirrors=False):
            conn = connections[alias]
            tables = [
                table
                for table in conn.introspection.django_table_names(
                    only_existing=True, include_views=False
                )
                if table not in KEPT_BY_FLUSH
            ]
            conn.ops.execute_sql_flush(conn.ops.sql_flush(no_style(), tables))
            ensure_role_groups(using=alias)
        ensure_system_schedules()

    TransactionTestCase._fixture_teardown = flush
    yield
    TransactionTestCase._fixture_teardown = original
