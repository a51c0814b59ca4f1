"""Typed values from the environment, for hopbase.settings (the one module
that reads them): each refuses a value it cannot parse with
``ImproperlyConfigured`` naming the variable, never a silent default.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ImproperlyConfigured(f"{name}={raw!r} must be a positive number of seconds")
    return value


# Several threads (log writer, admin, sweeps) write at once; WAL and IMMEDIATE
# transactions keep them from failing with "database is locked".
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def sqlite_database(path: str | Path, test_path: str | Path) -> dict:
    # The test database is a file, not memory: tests run the gateway as a
    # separate process.
    # Connections are kept, as PostgreSQL's are: opening one runs the
    # init_command and registers Django's functions, and the log writer
    # would otherwise do that for every batch.
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": SQLITE_OPTIONS,
        "CONN_MAX_AGE": 60,
        "TEST": {"NAME": test_path},
    }


def database_from_url(name: str, url: str | None) -> dict:
    """SQLite file when unset; PostgreSQL (psycopg 3) for postgres:// URLs."""
    if not url:
        return sqlite_database(BASE_DIR / "db.sqlite3", BASE_DIR / "var" / "test.sqlite3")
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if not path or path == "/":
            raise ImproperlyConfigured(f"{name}={url!r} names no SQLite file")
        return sqlite_database(path, path + "-test")
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"{name}={url!r}: unknown database scheme {parts.scheme!r} "
            "(use postgres://user@host:port/name or sqlite:///path)"
        )
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise ImproperlyConfigured(f"{name}={url!r} names no database")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={url!r} has a bad port") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        # A database host that stops answering must not hold a thread for
        # minutes (D3): give up connecting after 2 s, and notice a dead peer
        # (keep-alive probes; data unacknowledged for 15 s). Statements on the
        # hot path's own connections get a deadline too (core.snapshots).
        "OPTIONS": {
            "connect_timeout": 2,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": 15000,
        },
    }


def redis_url(name: str) -> str | None:
    url = os.environ.get(name) or None
    if url is not None and urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"{name}={url!r} is not a redis:// URL")
    return url


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def env_networks(name: str) -> tuple[str, ...]:
    """A comma list of addresses or CIDR networks (core.client_address)."""
    raw = os.environ.get(name, "")
    try:
        return tuple(str(ipaddress.ip_network(e.strip(), strict=False)) for e in raw.split(",") if e.strip())
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}={raw!r}: {error}") from None


def env_fernet_keys(name: str) -> tuple[str, ...]:
    """A comma list of Fernet keys (core.encryption). The message names the
    entry by position, never by value: a key is a secret."""
    keys = tuple(k.strip() for k in os.environ.get(name, "").split(",") if k.strip())
    for number, key in enumerate(keys, 1):
        try:
            valid = len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
        except (binascii.Error, ValueError, UnicodeEncodeError):
            valid = False
        if not valid:
            raise ImproperlyConfigured(
                f"{name}: entry {number} is not a Fernet key (32 url-safe base64-encoded bytes; make one with "
                "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
            )
    return keys
