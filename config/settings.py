"""Settings, read from the environment (see README: Configuration)."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

from core.env import (
    ConfigError,
    connection_target,
    database_from_url,
    env_bool,
    env_float,
    env_hex,
    env_identifier,
    env_int,
    env_list,
    env_secret,
    env_str,
    is_local_database,
)
from signatures import keys as signing_keys

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
# Demo mode: public demo key and plain-HTTP cookies, on this machine's database only.
DEMO = env_bool("RETENTION_DEMO", False)
DEMO_SECRET_KEY = "insecure-demo-key-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG and not DEMO:
        raise ConfigError("SECRET_KEY must be set when DEBUG is off (or set RETENTION_DEMO=1)")
    SECRET_KEY = DEMO_SECRET_KEY
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# The audit CSV export's statement timeout (a longer export is cut, and says so).
AUDIT_EXPORT_TIMEOUT_S = env_int("AUDIT_EXPORT_TIMEOUT_S", 300, minimum=1)
# the HTTP API's budget per token (django-ninja's throttle: N/s, N/m, N/h or N/d)
API_THROTTLE_RATE = env_str("API_THROTTLE_RATE", "600/m")
# the API's schema (/api/v1/openapi.json) and docs (/api/v1/docs) for anyone; off: a token's
# owner or a signed-in person holding a role only
API_PUBLIC_SCHEMA = env_bool("API_PUBLIC_SCHEMA", False)
METRICS_TOKEN = env_str("METRICS_TOKEN", "")  # bearer token for /metrics; empty: sign-in only
# Signs the chain anchors in manifests and checkpoints (runs.evidence.anchors); never stored in the
# database. RETENTION_EVIDENCE_KEY_FILE names a file holding it (e.g. a mounted secret).
RETENTION_EVIDENCE_KEY = env_secret("RETENTION_EVIDENCE_KEY", minimum_length=32)
# Sign and verify decisions (signatures/): the Ed25519 private key on the web host only, its
# public half on every host; demo mode with neither set uses the public demo key.
try:
    RETENTION_SIGNING_KEY, RETENTION_VERIFY_KEY = signing_keys.configured(
        env_secret("RETENTION_SIGNING_KEY", minimum_length=32),
        env_secret("RETENTION_VERIFY_KEY", minimum_length=32),
        demo=DEMO,
    )
except signing_keys.BadKey as exc:
    raise ConfigError(str(exc)) from None
# Its public half (64 hex digits, printed by `retention audit checkpoint`): the web and worker
# hosts check anchors with it, and serve a stored checkpoint only when it verifies.
RETENTION_EVIDENCE_PUBLIC_KEY = env_hex("RETENTION_EVIDENCE_PUBLIC_KEY", length=32)

# A compliance grant by one superuser makes an approver only once a second superuser confirms
# it; with this set (seconds), also once this long has passed (core.accounts).
COMPLIANCE_COOLING_OFF_S = env_int("COMPLIANCE_COOLING_OFF_S", 0, minimum=0)
CLEANUP_WORKERS = env_int("CLEANUP_WORKERS", 2, minimum=1, maximum=64)


# The run engine (docs/engine.md).
def _static_knobs(raw: str) -> tuple[int, int, float] | None:
    if not raw.strip():
        return None
    try:
        concurrency, chunk_ms, duty = (float(part) for part in raw.split(","))
    except ValueError:
        raise ConfigError(
            f"RETENTION_GUARD_STATIC must be CONCURRENCY,CHUNK_MS,DUTY_PCT like 2,300,50, got {raw!r}"
        ) from None
    if concurrency < 1 or chunk_ms < 10 or not 0 < duty <= 100:
        raise ConfigError(f"RETENTION_GUARD_STATIC out of range: {raw!r}")
    return int(concurrency), int(chunk_ms), duty / 100


def _gate_window() -> float:
    value = env_float("RETENTION_GATE_WINDOW_S", 1.0)
    if not 0 <= value <= 60:
        raise ConfigError(f"RETENTION_GATE_WINDOW_S must be between 0 and 60, got {value}")
    return value


RETENTION = {
    "GLOBAL_CEILING": env_int("RETENTION_GLOBAL_CEILING", 4, minimum=1, maximum=256),
    "LEASE_BUDGET_S": env_int("RETENTION_LEASE_BUDGET_S", 20, minimum=1, maximum=50),
    # on a target, one control-database transaction gates a lease's consecutive chunks for at
    # most this long (runs.fleet.mirror.gate): a decision waits at most this plus one chunk
    "GATE_WINDOW_S": _gate_window(),
    "PLANNER_WINDOW": env_int("RETENTION_PLANNER_WINDOW", 32, minimum=2, maximum=10_000),
    # the run's last eligible key: the largest among this many newest eligible rows, read along
    # the timestamp's index (0: exact, a backward read of the key's index past the young rows)
    "BOUND_ESTIMATE_ROWS": env_int(
        "RETENTION_BOUND_ESTIMATE_ROWS", 10_000, minimum=0, maximum=10_000_000
    ),
    "MAX_ATTEMPTS": env_int("RETENTION_MAX_ATTEMPTS", 5, minimum=1, maximum=100),
    # the run's circuit breaker: this many chunks in a row failing with the same run-level
    # cause (SQLSTATE and object) stop the run, its chunks kept pending (runs.engine.breaker)
    "BREAKER_CHUNKS": env_int("RETENTION_BREAKER_CHUNKS", 3, minimum=1, maximum=100),
    "SPLIT_FLOOR_ROWS": env_int("RETENTION_SPLIT_FLOOR_ROWS", 50, minimum=1),
    # Off by default: a chunk's DELETE, audit row and state commit together, so a commit
    # lost in a crash loses all three and the chunk is simply redone (docs/engine.md).
    "SYNCHRONOUS_COMMIT": env_bool("RETENTION_SYNCHRONOUS_COMMIT", False),
    "BROKER": env_str("RETENTION_BROKER", "orm"),
    "GUARD": env_bool("RETENTION_GUARD", True),
    # The probe against its own idle baseline (docs/guard.md): p95 over this ratio of the idle
    # p95 and at least the margin above it is pressure; under it chunk transactions may fill at
    # most GUARD_DUTY_CYCLE of the wall time of the last GUARD_DUTY_WINDOW_S (0: a hard stop).
    # a guard sample is reused by every worker for this long (then the next admission samples)
    "GUARD_SAMPLE_MS": env_int("RETENTION_GUARD_SAMPLE_MS", 500, minimum=1, maximum=60_000),
    # a thread in one draining process of the pool takes the samples beside the chunks
    # (runs.engine.guard, sample_beside); off, only the admissions between chunks take them
    "GUARD_SAMPLER_THREAD": env_bool("RETENTION_GUARD_SAMPLER_THREAD", True),
    # and, between its samples, probes the foreground this often (one thread in the pool)
    "GUARD_PROBE_MS": env_int("RETENTION_GUARD_PROBE_MS", 100, minimum=10, maximum=60_000),
    # The foreground's latency limit (docs/guard.md, "The limit"), as the team states its SLO:
    # an absolute p99 (RETENTION_GUARD_FG_P99_MS), or relative to the idle p99 with a floor:
    # max(GUARD_PROBE_RATIO × idle, idle + GUARD_PROBE_MARGIN_MS) — 2 × and 5 ms by default
    # (RETENTION_GUARD_INFLATION, RETENTION_GUARD_MARGIN_MS; the older names
    # RETENTION_GUARD_PROBE_RATIO_PCT and RETENTION_GUARD_PROBE_MARGIN_MS still apply when the
    # new ones are unset). Per policy: guard.fg_p99_ms, guard.inflation, guard.margin_ms.
    "GUARD_FG_P99_MS": env_float("RETENTION_GUARD_FG_P99_MS", None),
    "GUARD_PROBE_RATIO": env_float(
        "RETENTION_GUARD_INFLATION",
        env_int("RETENTION_GUARD_PROBE_RATIO_PCT", 200, minimum=101) / 100,
    ),
    "GUARD_PROBE_MARGIN_MS": env_float(
        "RETENTION_GUARD_MARGIN_MS", env_int("RETENTION_GUARD_PROBE_MARGIN_MS", 5, minimum=0)
    ),
    # which latency the limit judges: "probe" (built in), "prometheus" (the query's value, the
    # application's own p99 in seconds) or "both"; per policy: guard.signal
    "GUARD_SIGNAL": env_str("RETENTION_GUARD_SIGNAL", "probe") or "probe",
    # I/O signals the controller backs off on before a write-back burst stalls the foreground:
    # the host's /proc/pressure/io ("some" share of wall time; "auto": only when the database
    # is on this host) and the server's WAL fsync time per fsync (pg_stat_wal up to 17,
    # pg_stat_io from 18; needs track_wal_io_timing). Per policy: guard.io_pressure,
    # guard.wal_fsync_ms.
    # Static knobs instead of the latency controller, "CONCURRENCY,CHUNK_MS,DUTY_PCT" (the
    # bench's frontier sweep: the best static setting that holds a limit); the duty cycle then
    # applies whatever the probe reads. Empty: the controller sets them.
    "GUARD_STATIC": _static_knobs(env_str("RETENTION_GUARD_STATIC", "") or ""),
    "GUARD_IO_PRESSURE_SOURCE": env_str("RETENTION_GUARD_IO_PRESSURE_SOURCE", "auto") or "auto",
    "GUARD_IO_PRESSURE": env_float("RETENTION_GUARD_IO_PRESSURE", 0.3),
    "GUARD_WAL_FSYNC_MS": env_float("RETENTION_GUARD_WAL_FSYNC_MS", 20.0),
    "GUARD_DUTY_CYCLE": env_int("RETENTION_GUARD_DUTY_CYCLE_PCT", 50, minimum=0, maximum=100) / 100,
    "GUARD_DUTY_WINDOW_S": env_int("RETENTION_GUARD_DUTY_WINDOW_S", 10, minimum=1, maximum=3600),
    # The latency controller (docs/guard.md): every period it compares the probe's p99 with
    # its idle p99 against the inflation budget (GUARD_PROBE_RATIO, or the policy's
    # guard.inflation_budget) and halves or steps up the chunk transactions at once, the
    # chunk's target duration (not below the floor) and the duty cycle (not below its floor).
    "GUARD_CONTROL": env_bool("RETENTION_GUARD_CONTROL", True),
    "GUARD_CONTROL_PERIOD_MS": env_int(
        "RETENTION_GUARD_CONTROL_PERIOD_MS", 2000, minimum=100, maximum=600_000
    ),
    # A probe reading is idle only with no chunk of the table's runs in flight and none
    # committed within this gap: the CPU a chunk leaves behind (WAL, the next plan) is load.
    "GUARD_IDLE_GAP_MS": env_int("RETENTION_GUARD_IDLE_GAP_MS", 250, minimum=0, maximum=60_000),
    "GUARD_CHUNK_MS_FLOOR": env_int("RETENTION_GUARD_CHUNK_MS_FLOOR", 50, minimum=10),
    "GUARD_DUTY_FLOOR": env_int("RETENTION_GUARD_DUTY_FLOOR_PCT", 10, minimum=1, maximum=100) / 100,
    # An external admission signal: a Prometheus query over a threshold is pressure; no answer
    # is pressure once it has lasted the grace period. Per policy: guard.prometheus_* keys.
    # Pinned readings, for drills and tests that must not depend on how busy the machine is:
    # the probe reads this many ms instead of measuring, and the signals that other sessions
    # of the server make (instance-wide lock waits, replication lag, connections in use,
    # autovacuum and dead tuples) read as calm. Every decision is still taken and recorded.
    "GUARD_PINNED_PROBE_MS": env_float("RETENTION_GUARD_PINNED_PROBE_MS", None),
    "GUARD_PROMETHEUS_URL": env_str("RETENTION_GUARD_PROMETHEUS_URL", "") or "",
    "GUARD_PROMETHEUS_QUERY": env_str("RETENTION_GUARD_PROMETHEUS_QUERY", "") or "",
    "GUARD_PROMETHEUS_THRESHOLD": env_float("RETENTION_GUARD_PROMETHEUS_THRESHOLD", None),
    "GUARD_PROMETHEUS_TIMEOUT_MS": env_int(
        "RETENTION_GUARD_PROMETHEUS_TIMEOUT_MS", 1000, minimum=10, maximum=60_000
    ),
    "GUARD_PROMETHEUS_GRACE_S": env_int(
        "RETENTION_GUARD_PROMETHEUS_GRACE_S", 30, minimum=0, maximum=86_400
    ),
    "LEASE_STALE_S": env_int("RETENTION_LEASE_STALE_S", 0, minimum=0),  # 0: 3 × budget + 30 s
    # a run held for confirmation and not confirmed within this time expires
    "CONFIRM_EXPIRY_S": env_int("RETENTION_CONFIRM_EXPIRY_S", 86_400, minimum=60),
}
if RETENTION["GUARD_SIGNAL"] not in {"probe", "prometheus", "both"}:
    raise ConfigError(
        f"RETENTION_GUARD_SIGNAL must be probe, prometheus or both, got {RETENTION['GUARD_SIGNAL']!r}"
    )
if RETENTION["GUARD_IO_PRESSURE_SOURCE"] not in {"auto", "on", "off"}:
    raise ConfigError(
        "RETENTION_GUARD_IO_PRESSURE_SOURCE must be auto, on or off, got"
        f" {RETENTION['GUARD_IO_PRESSURE_SOURCE']!r}"
    )
if RETENTION["BROKER"] not in {"orm", "redis"}:
    raise ConfigError(f"RETENTION_BROKER must be orm or redis, got {RETENTION['BROKER']!r}")
DEADLINE_WORKERS = env_int("DEADLINE_WORKERS", 1, minimum=1, maximum=64)

_database_url = env_str("DATABASE_URL")
if not _database_url:
    from core import embedded_pg

    _database_url = embedded_pg.database_url()
    EMBEDDED_DATABASE = True
else:
    EMBEDDED_DATABASE = False
DATABASES = {"default": database_from_url("DATABASE_URL", _database_url)}
if DEMO and not EMBEDDED_DATABASE and not is_local_database(DATABASES["default"]):
    _host, _hostaddr = connection_target(DATABASES["default"])
    raise ConfigError(
        "RETENTION_DEMO=1 weakens security (the public demo SECRET_KEY when none is set, "
        "cookies without Secure, no HTTPS redirect or HSTS) and is refused with a database "
        f"that is not on this machine (host {_host or '-'}, hostaddr {_hostaddr or '-'}, "
        "as libpq resolves the URL, its service and the PG* environment): "
        "unset RETENTION_DEMO and set SECRET_KEY"
    )
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The guard tells the product's own sessions from foreground traffic by this name.
DATABASES["default"]["OPTIONS"].setdefault(
    "application_name", f"retention:{env_str('Q_CLUSTER_NAME', 'web') or 'web'}"
)
# The product's tables live in a schema of their own, so it can share an application's database
# without sharing its auth_user, django_session or django_migrations (docs/deploy.md). It comes
# first on the search path; the application's schema follows, so operators and types of its
# extensions (citext, ...) resolve in statements on its tables as they do for the application.
# `migrate` sees the product's schema only (database.schema).
DB_SCHEMA = env_identifier("RETENTION_SCHEMA", "retention_runner")
# A chunk's bounds are PostgreSQL's text of key values, read back by a later attempt, maybe in
# another process: pin the settings that shape that text against database and role defaults.
# No JIT: the product's statements are short, and a correlated subplan's estimate can cross
# jit_above_cost on a table of 60,000 rows — then compiling takes most of a verification's time
# (0.7 of 0.9 s on PostgreSQL 15, seconds on a busy host, past the engine's statement timeout).
_options = DATABASES["default"]["OPTIONS"]
_options["options"] = " ".join(
    filter(
        None,
        [
            _options.get("options", ""),
            "-c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1"
            " -c bytea_output=hex -c jit=off",
            f"-c search_path={DB_SCHEMA},public",
        ],
    )
)
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", None)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "ninja",
    "django_q",
    "axes",
    "signatures",
    "core",
    "retention",
    "runs",
    "database",
    "targets",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "core.signin.SerializedSignInMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.context_processors.roles",
                "core.reauth.context",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("PASSWORD_MIN_LENGTH", 12, minimum=8)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Passwords are hashed with Django's default, PBKDF2 (half a second of CPU per hash and per
# sign-in, by design). RETENTION_TEST_MD5_PASSWORDS=1 — set by the test suite for itself and
# every process it starts — hashes the suite's throwaway passwords with MD5 instead, so its
# thousands of sign-ins cost no CPU; anywhere else it is a weakness, and `manage.py check`
# says so (core.W002).
TEST_MD5_PASSWORDS = env_bool("RETENTION_TEST_MD5_PASSWORDS", False)
if TEST_MD5_PASSWORDS:
    from django.conf import global_settings

    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        *global_settings.PASSWORD_HASHERS,
    ]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Sessions and cookies: short-lived, HTTP-only; Secure when served over TLS.
SECURE_COOKIES = env_bool("SECURE_COOKIES", not DEBUG and not DEMO)
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600, minimum=60)
SESSION_COOKIE_HTTPONLY = True
# approving a version and creating a token ask for the password again after this long
REAUTH_WINDOW_S = env_int("REAUTH_WINDOW_S", 300, minimum=0, maximum=3600)
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
# HTTPS: redirect and HSTS are on whenever cookies are Secure (production); each can be set.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", SECURE_COOKIES)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # load-balancer probes over plain HTTP
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if SECURE_COOKIES else 0, minimum=0)
# On with HSTS; set them to 0 if a subdomain still serves plain HTTP (docs/security.md).
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_COOKIES)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", SECURE_COOKIES)
if env_bool("SECURE_PROXY_SSL_HEADER", False):  # behind a TLS-terminating proxy that sets it
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Sign-in throttling: django-axes, configured in core.signin (docs/security.md).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend for sealed accounts only (core.seals)
    "core.seals.SealedModelBackend",
]
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=1000)
LOGIN_USERNAME_CEILING = env_int("LOGIN_USERNAME_CEILING", 50, minimum=1, maximum=100_000)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 15 * 60, minimum=1)
# Proxies whose X-Forwarded-For is believed (addresses or networks, e.g. 10.0.0.0/8);
# empty: the peer address is the client's.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
AXES_HANDLER = "core.signin.SignInHandler"
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username"]
AXES_COOLOFF_TIME = timedelta(seconds=LOGIN_FAILURE_WINDOW_S)
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_CLIENT_IP_CALLABLE = "core.signin.client_address"
AXES_USERNAME_CALLABLE = "core.signin.username_of"
AXES_LOCKOUT_CALLABLE = "core.signin.lockout_response"
AXES_VERBOSE = False

# Two database caches that store JSON, never pickles (core.cache): "default" is the web
# process's (metrics totals, drain windows; the worker role has no grant
# on it), "cluster" holds django-q2's cluster stats, written by the workers and read by
# /healthz (docs/security.md).
CACHES = {
    "default": {"BACKEND": "core.cache.JSONDatabaseCache", "LOCATION": "core_cache"},
    "cluster": {"BACKEND": "core.cache.JSONDatabaseCache", "LOCATION": "core_cluster_cache"},
}

HOSTNAME = socket.gethostname()
# Error reports (DEBUG pages, admin mails) mask passwords in connection URLs too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "core.reporting.ReporterFilter"

# django-q2: the ORM broker keeps the queue in this database, so publishing
# work is an INSERT in the same transaction that records it (the ledger is the
# outbox). `retry` must exceed the longest time a task can stay dequeued.
_Q_BASE = {
    "orm": "default",
    "timeout": env_int("RETENTION_Q_TIMEOUT", 60, minimum=1),
    "retry": env_int("RETENTION_Q_RETRY", 120, minimum=2),
    "max_attempts": 1,
    # Results go to the cluster cache as signed JSON (core.cache), never to django_q_task: the
    # monitor would unpickle rows of that table, and no login of the workers may write a row
    # that any process unpickles (docs/security.md). Our ledger is the record of what ran.
    "cached": 300,
    "ack_failures": True,
    "catch_up": False,
    "guard_cycle": 0.5,
    "poll": 0.2,
    "queue_limit": 4,
    "bulk": 1,
    "label": "Task queue",
    "cache": "cluster",
}
if RETENTION["BROKER"] == "redis":
    _Q_BASE.pop("orm")
    _Q_BASE["redis"] = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
if _Q_BASE["retry"] <= _Q_BASE["timeout"]:
    raise ConfigError("RETENTION_Q_RETRY must exceed RETENTION_Q_TIMEOUT (a task would run twice)")
if RETENTION["LEASE_BUDGET_S"] >= _Q_BASE["timeout"]:
    raise ConfigError("RETENTION_LEASE_BUDGET_S must be below RETENTION_Q_TIMEOUT")
Q_CLUSTER = {**_Q_BASE, "name": "retention", "workers": 1}
Q_CLUSTER["ALT_CLUSTERS"] = {
    "cleanup": {"workers": CLEANUP_WORKERS},
    "deadline": {"workers": DEADLINE_WORKERS},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"client_errors": {"()": "core.logfilters.ClientErrorsWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # a 403 for a missing role is logged in one line, without a traceback
        "django.request": {"filters": ["client_errors"]},
    },
}
