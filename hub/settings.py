"""Settings for Switchboard. Every knob is an environment variable, read here and nowhere else.

Embedded mode (no REDIS_URL): SQLite in $SWITCHBOARD_HOME, in-memory channel layer, background
jobs run in-process. Production: DATABASE_URL (PostgreSQL) and REDIS_URL (channel layer, Celery
broker, shared rate limits).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from messaging.home import read_or_create_secret
from switchboard_agent.home import home_dir

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def channel_layer_prefix(redis_url: str) -> str:
    """The names the channel layer gives its Redis channels start with this. Redis pub/sub ignores
    database numbers (a PUBLISH on database 1 reaches a subscriber on database 2), so the number
    goes into the names: hubs given different databases of one Redis server, as their keys and
    Celery queues already are, do not hear each other's live events (an operator console of one
    would otherwise show the other's messages)."""
    from redis.connection import parse_url

    return f"switchboard.db{parse_url(redis_url).get('db') or 0}."


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in {"1", "true", "yes", "on"}


SWITCHBOARD_HOME = home_dir()
REDIS_URL = os.environ.get("REDIS_URL", "").strip() or None

SECRET_KEY = os.environ.get("SWITCHBOARD_SECRET_KEY") or read_or_create_secret("secret.key", nbytes=48)
DEBUG = _env_bool("SWITCHBOARD_DEBUG", False)
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("SWITCHBOARD_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],::1").split(",")
    if h.strip()
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("SWITCHBOARD_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # operator login lockout (see "Operator login" below)
    # django-ninja as an app: /api/docs renders its template with the Swagger UI files ninja ships,
    # served by the hub under /static/ninja/ (without it, ninja loads them from a CDN).
    "ninja",
    "channels",
    "messaging",
    "teams",
    "federation",
    "alerts",
    "console",
    "hub",  # the project: HubConfig.ready loads the Celery app; it holds the backup command
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",  # outside the guard: its 403s too
    # Before the session's: another page's request (an <img>, a fetch, a frame; the browser's
    # Sec-Fetch-Site says so) is refused before the login is read or its idle expiry moved on.
    "console.cross_site.CrossSiteGuard",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "axes.middleware.AxesMiddleware",  # answers a locked-out login with the lockout page
]

ROOT_URLCONF = "hub.urls"
ASGI_APPLICATION = "hub.asgi.application"

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
            ],
        },
    },
]

_default_sqlite = f"sqlite:///{SWITCHBOARD_HOME / 'switchboard.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "").strip() or _default_sqlite,
        conn_max_age=_env_int("SWITCHBOARD_DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["ENGINE"] = "hub.sqlite"  # Django's, writers queued on a lock (see there)
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers run beside the writer; IMMEDIATE takes the write lock at BEGIN, so two
        # writers queue on busy_timeout instead of failing with "database is locked" mid-transaction.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 10,
    }
    # A SQLite connection is a file handle in this process, and opening one costs more than most
    # requests (Django registers its SQL functions on each): keep it with the thread, which the
    # API's reused request threads (hub/api_asgi.py) make worth it. A thread that ends closes
    # its connection with it.
    if "SWITCHBOARD_DB_CONN_MAX_AGE" not in os.environ:
        DATABASES["default"]["CONN_MAX_AGE"] = None
# PostgreSQL under daphne: a connection pool per web process (at most SWITCHBOARD_DB_POOL
# connections). Persistent connections (CONN_MAX_AGE) do not work under ASGI, where each request
# runs on a thread of its own: they pile up until PostgreSQL refuses more; without either, every
# request pays for a new connection. Leave it unset for Celery workers (their pools fork).
_db_pool = _env_int("SWITCHBOARD_DB_POOL", 0)
if _db_pool and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": _db_pool,
        # With the database down, a request waits this long for a connection, then gets a 503.
        "timeout": _env_int("SWITCHBOARD_DB_POOL_TIMEOUT", 2),
        "max_idle": 60,  # give idle connections back, so quiet processes hold few
        # A connection that failed is replaced by retries whose wait doubles (1, 2, 4, 8 s ...) for
        # reconnect_timeout, so after an outage the pool would wait up to as long again before
        # it noticed PostgreSQL was back. Giving up after 2 s frees the slot, and the next waiting
        # request starts a fresh retry: a process reconnects within about a second of PostgreSQL.
        "reconnect_timeout": 2,
    }
# PostgreSQL: send parameters apart from the SQL and let psycopg prepare a statement the second
# time a connection runs it, so PostgreSQL plans each of the hub's few hot statements once per
# connection instead of on every call.
# SWITCHBOARD_DB_PREPARE=0 turns it off (e.g. behind a connection pooler that cannot keep them).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and _env_int(
    "SWITCHBOARD_DB_PREPARE", 1
):
    DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=2)
_test_db_name = os.environ.get("SWITCHBOARD_TEST_DB_NAME", "").strip()
if _test_db_name:
    DATABASES["default"]["TEST"] = {"NAME": _test_db_name}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Operator login ----------------------------------------------------------------------------
# Every operator password (operator_create, the admin's password forms) passes Django's validators.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": _env_int("SWITCHBOARD_PASSWORD_MIN_LENGTH", 12)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Lockout (django-axes): after SWITCHBOARD_LOGIN_FAILURE_LIMIT failed logins for one username, that
# username cannot log in, even with the right password, for SWITCHBOARD_LOGIN_COOLOFF_SECONDS or
# until an operator runs `manage.py operator_unlock NAME`. Counted by username, not address: behind
# the compose proxy every browser has the proxy's address. The attempts are rows in the database,
# so every web process sees the same count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = _env_int("SWITCHBOARD_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=_env_int("SWITCHBOARD_LOGIN_COOLOFF_SECONDS", 15 * 60))
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes warns that this leaves addresses uncounted: on purpose, since behind a proxy one address is
# every operator's, and a username is locked whichever address its guesses come from.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.views.login_locked_out"
AXES_VERBOSE = False
# Its admin pages are registered by console/admin.py instead, read-only: deleting a failed attempt
# would unlock a login with no audit; the unlock there is an action that calls the audited service.
AXES_ENABLE_ADMIN = False
# Console sessions end after SWITCHBOARD_SESSION_IDLE_SECONDS without a request (each request
# moves the expiry on). SWITCHBOARD_SECURE_COOKIES=1 behind TLS: the session and CSRF cookies are
# then only sent over HTTPS.
SESSION_COOKIE_AGE = _env_int("SWITCHBOARD_SESSION_IDLE_SECONDS", 3600)
SESSION_SAVE_EVERY_REQUEST = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SWITCHBOARD_SECURE_COOKIES = _env_bool("SWITCHBOARD_SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = SWITCHBOARD_SECURE_COOKIES
CSRF_COOKIE_SECURE = SWITCHBOARD_SECURE_COOKIES
# Both cookies are HttpOnly. Cookies are kept per host, not per port: without it, a page on any
# other port of the hub's host reads the CSRF cookie from `document.cookie` and writes its own over
# it, so every decision the operator posts fails its CSRF check. The console's script takes the
# token from the form the page rendered, never from the cookie.
CSRF_COOKIE_HTTPONLY = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = SWITCHBOARD_HOME / "static-collected"

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

# --- Channels -----------------------------------------------------------------------------------
CHANNEL_CAPACITY = _env_int("SWITCHBOARD_CHANNEL_CAPACITY", 10_000)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub: a group send is one PUBLISH that goes straight to the processes whose
            # sockets joined the group (the list-based layer costs a sorted-set read and a script
            # per group send, and a poll on the receiving side). Nothing is kept for a process that
            # is not listening; the hub needs nothing kept: the database has every change, and a
            # socket that (re)connects pulls what is queued.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                # redis-py 8 defaults socket_timeout to 5 s, which kills idle consumers (close 1011).
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                "prefix": channel_layer_prefix(REDIS_URL),
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": CHANNEL_CAPACITY, "expiry": 60},
        }
    }

# --- Celery ---------------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keeps the worker consuming after Redis dies with a task unacknowledged (see hub/celery.py).
CELERY_WORKER_CONSUMER = "hub.celery:Consumer"
# Celery's Django fixup closes a worker's database connections before and after every task, so
# each task opened a new one (a new PostgreSQL backend for each periodic job, several a second
# on an idle hub). Now it closes them every this many tasks only, and the worker drops a
# connection that is broken or too old itself, as Django does between requests (hub/celery.py).
CELERY_DB_REUSE_MAX = 1000
SWITCHBOARD_WORKER_DB_CONN_MAX_AGE = _env_int("SWITCHBOARD_WORKER_DB_CONN_MAX_AGE", 300)
# "inline" runs background jobs right after commit in the calling thread (tests);
# "thread" runs them on the in-process pool (embedded serve); "celery" sends them to the broker.
SWITCHBOARD_JOBS = os.environ.get("SWITCHBOARD_JOBS", "").strip() or ("celery" if REDIS_URL else "thread")

# --- Limits and policy defaults ---------------------------------------------------------------
SWITCHBOARD_MAX_MESSAGE_CHARS = _env_int("SWITCHBOARD_MAX_MESSAGE_CHARS", 1_000_000)
SWITCHBOARD_MAX_SUMMARY_CHARS = 200
SWITCHBOARD_MAX_NAME_CHARS = 64
# A JSON body can spend up to 12 bytes per character (a \ud83d\ude00 escape pair), plus the envelope.
DATA_UPLOAD_MAX_MEMORY_SIZE = SWITCHBOARD_MAX_MESSAGE_CHARS * 12 + 64 * 1024
SWITCHBOARD_STOPPED_HOLD_SECONDS = _env_int("SWITCHBOARD_STOPPED_HOLD_SECONDS", 24 * 3600)
SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = _env_int("SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT", 64)
SWITCHBOARD_STOPPED_HOLDS_PER_HUB = _env_int("SWITCHBOARD_STOPPED_HOLDS_PER_HUB", 1000)
# Of one stopped recipient's held messages, at most this many from one sender: no sender takes all
# of its room (messaging.services.sending.stopped_holds_checked).
SWITCHBOARD_STOPPED_HOLDS_PER_SENDER = _env_int(
    "SWITCHBOARD_STOPPED_HOLDS_PER_SENDER", (SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT + 1) // 2
)
# Of the hub's held messages for stopped sessions, at most this many from one sender, whichever
# stopped sessions they wait for: no sender takes all of the hub's room (same function).
SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB = _env_int(
    "SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB", (SWITCHBOARD_STOPPED_HOLDS_PER_HUB + 9) // 10
)
SWITCHBOARD_AUDIT_RETENTION_DAYS = _env_int("SWITCHBOARD_AUDIT_RETENTION_DAYS", 30)
# Retention (messaging.services.retention; 0 keeps forever): messages whose deliveries are all final,
# and exited sessions nothing refers to; checked every SWITCHBOARD_PURGE_SECONDS.
SWITCHBOARD_MESSAGE_RETENTION_DAYS = _env_int("SWITCHBOARD_MESSAGE_RETENTION_DAYS", 90)
SWITCHBOARD_SESSION_RETENTION_DAYS = _env_int("SWITCHBOARD_SESSION_RETENTION_DAYS", 30)
SWITCHBOARD_PURGE_SECONDS = _env_int("SWITCHBOARD_PURGE_SECONDS", 600)
SWITCHBOARD_INBOX_MAX_WAIT = _env_int("SWITCHBOARD_INBOX_MAX_WAIT", 60)
# Long-polls of one session waiting at once (messaging.services.waiting.inbox_wait); past it, 429.
SWITCHBOARD_WAITS_PER_SESSION = _env_int("SWITCHBOARD_WAITS_PER_SESSION", 8)
# Agent sockets of one session open at once in one web process (messaging.consumers.SocketPlaces).
SWITCHBOARD_SOCKETS_PER_SESSION = _env_int("SWITCHBOARD_SOCKETS_PER_SESSION", 8)
SWITCHBOARD_SWEEP_SECONDS = _env_int("SWITCHBOARD_SWEEP_SECONDS", 5)
# Local socket delivery: seconds for connect + write + ack, attempts before leaving it for pull,
# and how often due retries are started.
SWITCHBOARD_SOCKET_TIMEOUT = float(os.environ.get("SWITCHBOARD_SOCKET_TIMEOUT", "").strip() or 5)
SWITCHBOARD_SOCKET_ATTEMPTS = _env_int("SWITCHBOARD_SOCKET_ATTEMPTS", 5)
SWITCHBOARD_SOCKET_RETRY_SECONDS = _env_int("SWITCHBOARD_SOCKET_RETRY_SECONDS", 1)
SWITCHBOARD_ENROLL_KEY = os.environ.get("SWITCHBOARD_ENROLL_KEY", "").strip() or None
# The console shows a busy/idle session as "dead" when it has not been seen for this long.
SWITCHBOARD_DEAD_AFTER_SECONDS = _env_int("SWITCHBOARD_DEAD_AFTER_SECONDS", 600)
# Teams: how long a shutdown / plan / permission request waits for its answer, how long a
# notify-when-idle subscription lasts, ended teams' retention (0 keeps them), gate retry backoff base.
SWITCHBOARD_SHUTDOWN_TIMEOUT_SECONDS = _env_int("SWITCHBOARD_SHUTDOWN_TIMEOUT_SECONDS", 300)
SWITCHBOARD_FRAME_REQUEST_SECONDS = _env_int("SWITCHBOARD_FRAME_REQUEST_SECONDS", 3600)
SWITCHBOARD_IDLE_SUBSCRIPTION_SECONDS = _env_int("SWITCHBOARD_IDLE_SUBSCRIPTION_SECONDS", 12 * 3600)
SWITCHBOARD_TEAM_RETENTION_DAYS = _env_int("SWITCHBOARD_TEAM_RETENTION_DAYS", 30)
SWITCHBOARD_GATE_RETRY_SECONDS = float(os.environ.get("SWITCHBOARD_GATE_RETRY_SECONDS", "").strip() or 2)
# URLs the hub is given to call (quality gates, webhooks; messaging.outbound): loopback, link-local,
# private, multicast and reserved destinations are refused unless allowed here, all of them
# (ALLOW_PRIVATE=1), or some: a comma-separated list of host names, addresses and networks
# (e.g. "gates.internal,10.1.2.0/24,127.0.0.1").
SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE = _env_bool("SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE", False)
SWITCHBOARD_OUTBOUND_ALLOW = [
    h.strip() for h in os.environ.get("SWITCHBOARD_OUTBOUND_ALLOW", "").split(",") if h.strip()
]
# Operator alerts (alerts.services; docs/operations.md "Alerts"): where to post them (empty: no
# webhook alerts), as what (slack | ntfy | json), how long before a hold's expiry it is called
# about to expire, the timeout of one post and how many tries a failed one gets. Links in an alert
# lead to the console at SWITCHBOARD_ALERT_CONSOLE_URL (default SWITCHBOARD_PUBLIC_URL).
SWITCHBOARD_ALERT_WEBHOOK_URL = os.environ.get("SWITCHBOARD_ALERT_WEBHOOK_URL", "").strip()
SWITCHBOARD_ALERT_FORMAT = os.environ.get("SWITCHBOARD_ALERT_FORMAT", "").strip().lower() or "slack"
if SWITCHBOARD_ALERT_FORMAT not in ("slack", "ntfy", "json"):
    raise ImproperlyConfigured(
        f"SWITCHBOARD_ALERT_FORMAT is slack, ntfy or json, not {SWITCHBOARD_ALERT_FORMAT!r}."
    )
SWITCHBOARD_ALERT_ON = [
    k.strip()
    for k in os.environ.get("SWITCHBOARD_ALERT_ON", "escalated_hold,hold_expiring,session_dead").split(",")
    if k.strip()
]
SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS = _env_int("SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS", 60)
SWITCHBOARD_ALERT_SECONDS = float(os.environ.get("SWITCHBOARD_ALERT_SECONDS", "").strip() or 5)
SWITCHBOARD_ALERT_TIMEOUT_SECONDS = float(
    os.environ.get("SWITCHBOARD_ALERT_TIMEOUT_SECONDS", "").strip() or 5
)
SWITCHBOARD_ALERT_ATTEMPTS = _env_int("SWITCHBOARD_ALERT_ATTEMPTS", 3)
# How long a team invitation (or a session's request to join) waits for the other side's answer.
SWITCHBOARD_TEAM_INVITATION_SECONDS = _env_int("SWITCHBOARD_TEAM_INVITATION_SECONDS", 24 * 3600)
# Open team invitations one session holds, from the leads of all teams: past it a lead's invite is
# refused (teams.services.invitations), so sessions that each lead a team cannot flood one inbox.
SWITCHBOARD_INVITATIONS_PER_RECIPIENT = _env_int("SWITCHBOARD_INVITATIONS_PER_RECIPIENT", 10)
# At most this many waiting notify-when-idle subscriptions per subscriber.
SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION = _env_int("SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION", 50)
# Open (pending or in progress) tasks that sessions created: at most this many on one team's board,
# and at most this many of one session's, on whichever teams (teams.services.tasks.task_room_check).
# Tasks an operator creates are not counted and never refused.
SWITCHBOARD_OPEN_TASKS_PER_TEAM = _env_int("SWITCHBOARD_OPEN_TASKS_PER_TEAM", 500)
SWITCHBOARD_OPEN_TASKS_PER_SESSION = _env_int(
    "SWITCHBOARD_OPEN_TASKS_PER_SESSION", (SWITCHBOARD_OPEN_TASKS_PER_TEAM + 1) // 2
)
# Notices the team machinery writes on its own (idle, fired subscription, task unblocked,
# invitation): at most this many of one kind from one source to one recipient per window; a notice
# that replaces an unread older one costs nothing.
SWITCHBOARD_NOTICE_RATE = _env_int("SWITCHBOARD_NOTICE_RATE", 10)
SWITCHBOARD_NOTICE_RATE_SECONDS = _env_int("SWITCHBOARD_NOTICE_RATE_SECONDS", 60)
# Team changes one session makes (create or end a team, invite, ask to join, withdraw an
# invitation or a request to join): at most this many per window (teams.services.teams.team_change_bounded). Each writes
# rows and audit events; an operator's changes are not counted.
SWITCHBOARD_TEAM_CHANGE_RATE = _env_int("SWITCHBOARD_TEAM_CHANGE_RATE", 30)
SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS = _env_int("SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS", 60)

# --- Inbound policy, holds and loop protection (messaging.policy, services.holds/limits) ---------
SWITCHBOARD_HOLD_EXPIRY_SECONDS = _env_int("SWITCHBOARD_HOLD_EXPIRY_SECONDS", 300)
SWITCHBOARD_HOLDS_PER_RECIPIENT = _env_int("SWITCHBOARD_HOLDS_PER_RECIPIENT", 100)
# Of the holds for an operator that a hub key nobody vouched for (first use, revoked with mode hold)
# has waiting here, whichever recipients and whichever of its senders, at most this many: one key
# made at home fills neither a recipient's room for such holds nor the operator's list
# (federation.services.hub_shares).
SWITCHBOARD_PEER_HOLDS_PER_KEY = _env_int(
    "SWITCHBOARD_PEER_HOLDS_PER_KEY", (SWITCHBOARD_HOLDS_PER_RECIPIENT + 1) // 2
)
# When on, a sensitive message from a verified sender is not forced into a hold (escalate=none).
SWITCHBOARD_SENSITIVE_EXEMPT_VERIFIED = _env_bool("SWITCHBOARD_SENSITIVE_EXEMPT_VERIFIED", False)
SWITCHBOARD_RATE_PAIR = _env_int("SWITCHBOARD_RATE_PAIR", 10)  # messages per sender→recipient ...
SWITCHBOARD_RATE_PAIR_SECONDS = _env_int("SWITCHBOARD_RATE_PAIR_SECONDS", 10)  # ... per this many s
SWITCHBOARD_RATE_HUB = _env_int("SWITCHBOARD_RATE_HUB", 2000)  # messages hub-wide ...
SWITCHBOARD_RATE_HUB_SECONDS = _env_int("SWITCHBOARD_RATE_HUB_SECONDS", 10)  # ... per this many s
SWITCHBOARD_DEDUPE_SECONDS = _env_int("SWITCHBOARD_DEDUPE_SECONDS", 60)
# A sender's single sends in flight at the same time are written together (messaging.services.together).
SWITCHBOARD_SEND_TOGETHER = _env_bool("SWITCHBOARD_SEND_TOGETHER", True)
SWITCHBOARD_UNREAD_PER_RECIPIENT = _env_int("SWITCHBOARD_UNREAD_PER_RECIPIENT", 50)
# Of those, at most this many from one sender (default: half the cap, rounded up), so one sender
# alone never fills a recipient's inbox for every other.
SWITCHBOARD_UNREAD_PER_SENDER = _env_int(
    "SWITCHBOARD_UNREAD_PER_SENDER", (SWITCHBOARD_UNREAD_PER_RECIPIENT + 1) // 2
)
if SWITCHBOARD_UNREAD_PER_SENDER > SWITCHBOARD_UNREAD_PER_RECIPIENT:
    raise ImproperlyConfigured(
        f"SWITCHBOARD_UNREAD_PER_SENDER ({SWITCHBOARD_UNREAD_PER_SENDER}) is at most "
        f"SWITCHBOARD_UNREAD_PER_RECIPIENT ({SWITCHBOARD_UNREAD_PER_RECIPIENT})."
    )
# A reply loop: both directions of a pair above this many messages within the window → held.
SWITCHBOARD_LOOP_EXCHANGES = _env_int("SWITCHBOARD_LOOP_EXCHANGES", 20)
SWITCHBOARD_LOOP_WINDOW_SECONDS = _env_int("SWITCHBOARD_LOOP_WINDOW_SECONDS", 1800)
SWITCHBOARD_LIMITS_PREFIX = os.environ.get("SWITCHBOARD_LIMITS_PREFIX", "").strip() or "sb:limits"

# --- Federation (other hubs: channel registry, LAN peers, relay) ---------------------------------
SWITCHBOARD_HUB_NAME = os.environ.get("SWITCHBOARD_HUB_NAME", "").strip()
SWITCHBOARD_ROLE = os.environ.get("SWITCHBOARD_ROLE", "").strip() or "hub"  # "hub" | "relay"
# Where this hub answers other hubs; `switchboard serve` sets it. Empty: no channel registration.
SWITCHBOARD_PUBLIC_URL = os.environ.get("SWITCHBOARD_PUBLIC_URL", "").strip().rstrip("/")


def _public_host(url: str) -> str | None:
    """The Host other hubs send when they call this hub at its public URL (hub.request_guard
    refuses every Host outside ALLOWED_HOSTS): the hub's own advertised address is always one."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname if url else None
    return f"[{host}]" if host and ":" in host else host


SWITCHBOARD_ALERT_CONSOLE_URL = (
    os.environ.get("SWITCHBOARD_ALERT_CONSOLE_URL", "").strip().rstrip("/") or SWITCHBOARD_PUBLIC_URL
)
for _url in (SWITCHBOARD_PUBLIC_URL, SWITCHBOARD_ALERT_CONSOLE_URL):
    _public = _public_host(_url)
    if _public and _public not in ALLOWED_HOSTS:
        ALLOWED_HOSTS.append(_public)
# The machine-wide registry (channel tier). A hub on the default home joins ~/.switchboard-registry;
# a hub with its own SWITCHBOARD_HOME (a dev build, a test) joins only when this is set explicitly.
_registry_dir = os.environ.get("SWITCHBOARD_REGISTRY_DIR", "").strip()
SWITCHBOARD_REGISTRY_DIR: Path | None = (
    Path(_registry_dir).expanduser()
    if _registry_dir
    else (None if os.environ.get("SWITCHBOARD_HOME") else Path.home() / ".switchboard-registry")
)
SWITCHBOARD_REGISTRY_STALE_SECONDS = _env_int("SWITCHBOARD_REGISTRY_STALE_SECONDS", 4 * 3600)


def _url_and_key(entry: str) -> tuple[str, str]:
    """`url` or `url#key` (the hub's base64 Ed25519 public key, which an operator copied from that
    hub's `GET /api/v1/federation/hub`): the URL without a trailing slash, and the key or ""."""
    url, _, key = entry.strip().partition("#")
    return url.strip().rstrip("/"), key.strip()


# LAN peers to ask, `url` or `url#key`. Messages are sealed to a LAN peer's key, so a peer is used
# only with a key this hub got from a verified source: given here, or pinned by an operator.
_lan_peers = [_url_and_key(u) for u in os.environ.get("SWITCHBOARD_LAN_PEERS", "").split(",") if u.strip()]
SWITCHBOARD_LAN_PEERS = [url for url, _ in _lan_peers]
SWITCHBOARD_LAN_PEER_KEYS = {url: key for url, key in _lan_peers if key}
# The relay, `url` or `url#key`; its key (or SWITCHBOARD_RELAY_KEY) binds this hub's requests to it.
SWITCHBOARD_RELAY_URL, _relay_key = _url_and_key(os.environ.get("SWITCHBOARD_RELAY_URL", ""))
SWITCHBOARD_RELAY_KEY = os.environ.get("SWITCHBOARD_RELAY_KEY", "").strip() or _relay_key
SWITCHBOARD_LAN_DISCOVERY = _env_bool("SWITCHBOARD_LAN_DISCOVERY", False)  # mDNS, needs `zeroconf`
# Trust on first use (on by default): a hub key that neither the registry, a configured LAN
# peer nor an operator's pin vouches for is recorded on first use and its messages are held for
# an operator (`unknown_peer`, escalate=required, trust `unverified`); off, such a key is refused.
SWITCHBOARD_PEER_TOFU = _env_bool("SWITCHBOARD_PEER_TOFU", True)
SWITCHBOARD_ISOLATED = _env_bool("SWITCHBOARD_ISOLATED", False)
SWITCHBOARD_MAX_HOPS = _env_int("SWITCHBOARD_MAX_HOPS", 3)
SWITCHBOARD_HOSTS_CACHE_SECONDS = _env_int("SWITCHBOARD_HOSTS_CACHE_SECONDS", 60)
# Stand-ins for another hub's senders: at most this many per hub (past it, new senders share one),
# and one that nothing refers to is deleted after this long unused.
SWITCHBOARD_REMOTE_SESSIONS_PER_PEER = _env_int("SWITCHBOARD_REMOTE_SESSIONS_PER_PEER", 200)
SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS = _env_int("SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS", 24 * 3600)
SWITCHBOARD_FEDERATION_TIMEOUT = float(os.environ.get("SWITCHBOARD_FEDERATION_TIMEOUT", "") or 3.0)
SWITCHBOARD_FEDERATION_POLL_SECONDS = float(os.environ.get("SWITCHBOARD_FEDERATION_POLL_SECONDS", "") or 2.0)
SWITCHBOARD_RELAY_EXPIRY_SECONDS = _env_int("SWITCHBOARD_RELAY_EXPIRY_SECONDS", 24 * 3600)
SWITCHBOARD_RELAY_LEASE_SECONDS = _env_int("SWITCHBOARD_RELAY_LEASE_SECONDS", 60)
SWITCHBOARD_RELAY_CLAIM_SECONDS = _env_int("SWITCHBOARD_RELAY_CLAIM_SECONDS", 120)
# A receipt batch the relay keeps, sealed: the largest a hub makes (500 receipts) is about 37 kB.
SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES = _env_int("SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES", 256 * 1024)
# Sealed bytes one pull answer carries (the first message and the first receipt batch go however
# large, so one answer is at most this or one 80 MB message, plus one receipt batch); the rest waits
# for the next pull.
SWITCHBOARD_RELAY_PULL_MAX_BYTES = _env_int("SWITCHBOARD_RELAY_PULL_MAX_BYTES", 64 * 1024 * 1024)
# What one storing hub key may keep waiting at the relay (messages and receipts not yet pulled).
SWITCHBOARD_RELAY_PENDING_PER_HUB = _env_int("SWITCHBOARD_RELAY_PENDING_PER_HUB", 2000)
SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB = _env_int(
    "SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB", 400 * 1024 * 1024
)
# Uploaded files no message uses yet: at most this many bytes per session, and removed once this
# many seconds have passed since they were stored and last uploaded (federation.services.files).
SWITCHBOARD_FILE_QUOTA_BYTES = _env_int("SWITCHBOARD_FILE_QUOTA_BYTES", 400 * 1024 * 1024)
SWITCHBOARD_FILE_ORPHAN_SECONDS = _env_int("SWITCHBOARD_FILE_ORPHAN_SECONDS", 24 * 3600)
SWITCHBOARD_FILES_DIR = Path(
    os.environ.get("SWITCHBOARD_FILES_DIR", "").strip() or SWITCHBOARD_HOME / "files"
)

_task_log_level = os.environ.get("SWITCHBOARD_TASK_LOG_LEVEL", "WARNING").strip().upper() or "WARNING"
# A Celery worker serves its own metrics (task run time, socket writes) on this port when set
# (0: off); web processes serve theirs at /api/v1/metrics (docs/operations.md).
SWITCHBOARD_WORKER_METRICS_PORT = _env_int("SWITCHBOARD_WORKER_METRICS_PORT", 0)
SWITCHBOARD_WORKER_METRICS_HOST = (
    os.environ.get("SWITCHBOARD_WORKER_METRICS_HOST", "127.0.0.1").strip() or "127.0.0.1"
)
# `plain` (one readable line per event, the default) or `json` (one JSON object per line, for log
# collectors; see hub.logs.JsonLines).
SWITCHBOARD_LOG_FORMAT = os.environ.get("SWITCHBOARD_LOG_FORMAT", "plain").strip().lower() or "plain"
if SWITCHBOARD_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"SWITCHBOARD_LOG_FORMAT is plain or json, not {SWITCHBOARD_LOG_FORMAT!r}.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"beat_sends": {"()": "hub.logs.BeatSendsBelow", "level": _task_log_level}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "hub.logs.JsonLines"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": SWITCHBOARD_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("SWITCHBOARD_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # One line per task as the worker takes it and as it finishes, and as beat sends it: the
        # periodic jobs alone made several a second each (failures are still logged, at ERROR;
        # beat's other lines, such as "beat: Starting...", stay).
        **{name: {"level": _task_log_level} for name in ("celery.app.trace", "celery.worker.strategy")},
        "celery.beat": {"filters": ["beat_sends"]},
    },
}
