"""Every setting HopBase has, read from the environment in this one place.

No other module reads ``os.environ`` (hopbase.environment parses values for
this one). A value that cannot be parsed stops start-up with
``ImproperlyConfigured`` naming the variable, so a typo in a deployment
never turns into a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from hopbase.environment import (
    BASE_DIR,
    database_from_url,
    env_bool,
    env_fernet_keys,
    env_int,
    env_list,
    env_networks,
    env_seconds,
    env_str,
    redis_url,
)

DEBUG = env_bool("HOPBASE_DEBUG", False)
# Signs the admin's sessions and CSRF tokens, and (unless
# HOPBASE_ENCRYPTION_KEYS is set) keys the channel secrets at rest: never a
# value anyone else knows.
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: give it a long random value, e.g. from "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))' "
            "(only HOPBASE_DEBUG=1, for development, runs without one)"
        )
    SECRET_KEY = "hopbase-insecure-development-key"  # HOPBASE_DEBUG=1 only
# Host names the admin answers to. The API paths (serving.handler) never build a
# URL from the Host header and take any.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

# Behind a reverse proxy that terminates TLS (HOPBASE_BEHIND_TLS=1): cookies
# only over HTTPS, HSTS, and the scheme read from X-Forwarded-Proto, which
# that proxy must set (overwriting the client's). Plain HTTP is redirected by
# the proxy; HOPBASE_SSL_REDIRECT=1 makes Django redirect the admin too.
HOPBASE_BEHIND_TLS = env_bool("HOPBASE_BEHIND_TLS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HOPBASE_BEHIND_TLS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HOPBASE_BEHIND_TLS else None
SECURE_HSTS_SECONDS = env_int("HOPBASE_HSTS_SECONDS", 365 * 24 * 3600 if HOPBASE_BEHIND_TLS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_SSL_REDIRECT = env_bool("HOPBASE_SSL_REDIRECT", False)
SILENCED_SYSTEM_CHECKS = [
    # HSTS preload commits a whole registrable domain (hstspreload.org): its
    # owner's decision, not the gateway's.
    "security.W021",
    # Behind TLS without HOPBASE_SSL_REDIRECT the proxy redirects plain HTTP.
    *(["security.W008"] if HOPBASE_BEHIND_TLS and not SECURE_SSL_REDIRECT else []),
]


# Keys for channel secrets at rest: the first encrypts, all decrypt. Unset:
# one key derived from SECRET_KEY (core.encryption).
HOPBASE_ENCRYPTION_KEYS = env_fernet_keys("HOPBASE_ENCRYPTION_KEYS")

# Addresses or networks of the reverse proxies whose X-Forwarded-For is
# believed, for the client address the throttles count by. None by default.
HOPBASE_TRUSTED_PROXIES = env_networks("HOPBASE_TRUSTED_PROXIES")
# Failed API authentications one client address may make in a window of
# seconds before its new keys are refused (429) until the window ends.
HOPBASE_AUTH_FAILURES = env_int("HOPBASE_AUTH_FAILURES", 20, minimum=1)
HOPBASE_AUTH_FAILURE_WINDOW = env_seconds("HOPBASE_AUTH_FAILURE_WINDOW", 60)

DATABASES = {"default": database_from_url("DATABASE_URL", os.environ.get("DATABASE_URL"))}
REDIS_URL = redis_url("REDIS_URL")

# Gateway timers (operator contract; seconds, may be fractional).
HOPBASE_KEEPALIVE_INTERVAL = env_seconds("HOPBASE_KEEPALIVE_INTERVAL", 10)
HOPBASE_FIRST_TOKEN_TIMEOUT = env_seconds("HOPBASE_FIRST_TOKEN_TIMEOUT", 10)
HOPBASE_FIRST_TOKEN_PER_10K = env_seconds("HOPBASE_FIRST_TOKEN_PER_10K", 1)
HOPBASE_HOLD_MAX = env_seconds("HOPBASE_HOLD_MAX", 15)
HOPBASE_STALL_TIMEOUT = env_seconds("HOPBASE_STALL_TIMEOUT", 180)
HOPBASE_CAPACITY_WAIT = env_seconds("HOPBASE_CAPACITY_WAIT", 5)
# How long a request's budget reservation holds unless its process renews
# it (G2): a killed process's reservations free their budgets within this.
HOPBASE_RESERVATION_LEASE = env_seconds("HOPBASE_RESERVATION_LEASE", 300)
# What a request that names no output limit is assumed to write at most, for
# its budget reservation and TPM count (G2, G5, G7), where the model's price
# sets no ceiling of its own: 32,000, the most HopBase itself asks of a
# Claude channel for a caller that named no limit.
HOPBASE_DEFAULT_OUTPUT_CAP = env_int("HOPBASE_DEFAULT_OUTPUT_CAP", 32_000, minimum=1)
# On SIGTERM, the longest wait for requests in flight before they are ended (D1).
HOPBASE_DRAIN_TIMEOUT = env_seconds("HOPBASE_DRAIN_TIMEOUT", 30)
# Gateway limits and caches of our own.
HOPBASE_MAX_BODY_BYTES = env_int("HOPBASE_MAX_BODY_BYTES", 20 * 1024 * 1024, minimum=1024)
# How long a connection may take to send a request's head (its request line
# and headers, at most 64 KiB) once it has begun, or once it connected:
# past it, 408 and the connection closed (serving.request_heads).
HOPBASE_HEAD_TIMEOUT = env_seconds("HOPBASE_HEAD_TIMEOUT", 60)
# How long a key, channel list or price list is trusted before the database is
# asked again. A revoked key is refused at once where Redis carries the news
# (tenants.revocations), within this many seconds where it does not.
HOPBASE_CONFIG_TTL = env_seconds("HOPBASE_CONFIG_TTL", 5)
# While the database is unreachable, how long a key, channel list or price
# list already known is still served (D3); a key never seen gets a 503. With
# Redis unreachable too, a key revoked meanwhile may be served as long.
HOPBASE_STALE_MAX_AGE = env_seconds("HOPBASE_STALE_MAX_AGE", 600)
HOPBASE_CONNECT_TIMEOUT = env_seconds("HOPBASE_CONNECT_TIMEOUT", 10)
# Whether a channel may point at this machine (loopback: a model server
# beside the gateway, the simulator in tests and the demo); the link-local
# range (cloud metadata) never may (channels_pool.destinations). Set 0 where
# nothing on the gateway's machine is a model provider.
HOPBASE_ALLOW_LOOPBACK_CHANNELS = env_bool("HOPBASE_ALLOW_LOOPBACK_CHANNELS", True)
HOPBASE_UPSTREAM_MAX_CONNECTIONS = env_int("HOPBASE_UPSTREAM_MAX_CONNECTIONS", 2000, minimum=1)
# Requests one process holds open at once; the excess is refused at once
# (serving.admission). 0: derived from RLIMIT_NOFILE and the upstream pool.
HOPBASE_MAX_OPEN_REQUESTS = env_int("HOPBASE_MAX_OPEN_REQUESTS", 0)
HOPBASE_LOG_FLUSH_INTERVAL = env_seconds("HOPBASE_LOG_FLUSH_INTERVAL", 0.2)
# The journal of request records not yet in the database (billing.spool):
# survives the death of the process, not of the machine.
HOPBASE_SPOOL_DIR = Path(env_str("HOPBASE_SPOOL_DIR", str(BASE_DIR / "var" / "spool")))
HOPBASE_SPOOL_MAX_BYTES = env_int("HOPBASE_SPOOL_MAX_BYTES", 256 * 1024 * 1024, minimum=1024)
# If set, GET /metrics needs "Authorization: Bearer <token>".
HOPBASE_METRICS_TOKEN = env_str("HOPBASE_METRICS_TOKEN", "")
# Where prometheus-client keeps the counters of several processes (it reads
# the variable itself; manage.py serve sets it for its workers).
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
# A stream whose client has this much sent to it but not yet taken (as far as
# the server can tell) is ended with the interruption event.
HOPBASE_MAX_UNSENT_BYTES = env_int("HOPBASE_MAX_UNSENT_BYTES", 4 * 1024 * 1024, minimum=4096)
# Circuit breaker (channels_pool.health): failures in a row before a channel
# is skipped, and the first and longest cool-down.
HOPBASE_BREAKER_FAILURES = env_int("HOPBASE_BREAKER_FAILURES", 3, minimum=1)
HOPBASE_BREAKER_COOLDOWN = env_seconds("HOPBASE_BREAKER_COOLDOWN", 5)
HOPBASE_BREAKER_MAX_COOLDOWN = env_seconds("HOPBASE_BREAKER_MAX_COOLDOWN", 300)
# Budget alert webhooks (G4, billing.budgets.alerts): the deadline of one delivery
# attempt, the delay before the first retry (doubled after each failure, at
# most 10 minutes), and the retries before an undelivered alert is given up
# (10: about 40 minutes of trying at the defaults).
HOPBASE_WEBHOOK_TIMEOUT = env_seconds("HOPBASE_WEBHOOK_TIMEOUT", 5)
HOPBASE_WEBHOOK_RETRY_BASE = env_seconds("HOPBASE_WEBHOOK_RETRY_BASE", 5)
HOPBASE_WEBHOOK_MAX_RETRIES = env_int("HOPBASE_WEBHOOK_MAX_RETRIES", 10)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "tenants",
    "hopbase",
    "channels_pool",
    "billing",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hopbase.urls"
ASGI_APPLICATION = "hopbase.asgi.application"
WSGI_APPLICATION = None

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

# The tenant console (/console/): a signed-in customer is signed out after
# this many seconds, however active (K4: sessions expire).
HOPBASE_CONSOLE_SESSION_AGE = env_int("HOPBASE_CONSOLE_SESSION_AGE", 8 * 3600, minimum=60)
# One-time links of the console: an invitation works this long, a password
# reset link (Django's token generator) this long.
HOPBASE_CONSOLE_INVITE_AGE = env_int("HOPBASE_CONSOLE_INVITE_AGE", 7 * 86400, minimum=60)
PASSWORD_RESET_TIMEOUT = env_int("HOPBASE_CONSOLE_RESET_AGE", 3600, minimum=60)
# The address customers reach the gateway at (https://llm.example.com), for
# the links the operator commands print; the console's own pages use the
# address they were asked on.
HOPBASE_PUBLIC_URL = env_str("HOPBASE_PUBLIC_URL", "").rstrip("/")
# Mail for invitations and password resets, by Django's SMTP backend; with
# no EMAIL_HOST nothing is sent and the links are handed over by hand.
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", EMAIL_PORT == 587)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", EMAIL_PORT == 465)
EMAIL_TIMEOUT = env_seconds("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "HopBase <no-reply@localhost>")

# Staff and console passwords (the admin, manage.py createstaff, createtenantuser).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# The gateway enforces its own body limit (HOPBASE_MAX_BODY_BYTES) so that an
# oversized body gets a 413 in the caller's protocol, not Django's plain 400.
DATA_UPLOAD_MAX_MEMORY_SIZE = None

if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery: Redis as broker when REDIS_URL is set, otherwise tasks run eagerly in-process.
# (A host, though unused: kombu warns of a memory URL without one.)
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
CELERY_TASK_ALWAYS_EAGER = REDIS_URL is None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A publish must never hang a request while Redis is down: fail fast, and let
# the periodic sweep settle what was not queued.
CELERY_BROKER_CONNECTION_TIMEOUT = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 0, "socket_connect_timeout": 1, "socket_timeout": 2}
CELERY_TASK_PUBLISH_RETRY = False
HOPBASE_SWEEP_INTERVAL = env_seconds("HOPBASE_SWEEP_INTERVAL", 60)
# Celery beat (only with REDIS_URL) settles what no task did; without Redis the
# gateway runs the same sweep in-process, as a periodic job (billing.jobs).
CELERY_BEAT_SCHEDULE = {
    "sweep-unsettled-request-logs": {
        "task": "billing.tasks.sweep_unsettled",
        "schedule": HOPBASE_SWEEP_INTERVAL,
        # A sweep that could not start before the next one is due is redundant.
        "options": {"expires": HOPBASE_SWEEP_INTERVAL},
    },
}
# Test hook only (tests/processes/test_settlement_worker.py): the settlement step at which a
# worker kills itself, to prove a crash loses and doubles nothing. Empty: never.
HOPBASE_TEST_CRASH_AT = env_str("HOPBASE_TEST_CRASH_AT", "")

# One JSON object a line for log search, or plain text for development.
HOPBASE_LOG_FORMAT = env_str("HOPBASE_LOG_FORMAT", "text" if DEBUG else "json")
if HOPBASE_LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured(f"HOPBASE_LOG_FORMAT: {HOPBASE_LOG_FORMAT!r} is not json or text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "core.logs.JsonFormatter"},
        "text": {"()": "core.logs.TextFormatter", "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "filters": {"link_tokens": {"()": "core.logs.HideLinkTokens", "prefixes": ["/console/invite/", "/console/reset/"]}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": HOPBASE_LOG_FORMAT,
                             "filters": ["link_tokens"]}},
    "root": {"handlers": ["console"], "level": env_str("HOPBASE_LOG_LEVEL", "INFO")},
    "loggers": {
        # One line per request comes from HopBase itself; httpx would log every
        # upstream call (with its URL) and Daphne every access.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        # Django's own handlers (DEBUG's console, mail to ADMINS) would write
        # its lines before the root handler's filter hides one-time tokens.
        "django": {"handlers": [], "propagate": True},
    },
}
