"""Settings from the environment: typed helpers, and start-up refusing a bad value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from hopbase.settings import (
    database_from_url,
    env_bool,
    env_int,
    env_seconds,
    redis_url,
)


def test_it_reads_fractional_seconds(monkeypatch):
    monkeypatch.setenv("HOPBASE_STALL_TIMEOUT", "2.5")
    assert env_seconds("HOPBASE_STALL_TIMEOUT", 180) == 2.5


def test_it_uses_the_default_when_unset_or_empty(monkeypatch):
    monkeypatch.delenv("HOPBASE_STALL_TIMEOUT", raising=False)
    assert env_seconds("HOPBASE_STALL_TIMEOUT", 180) == 180
    monkeypatch.setenv("HOPBASE_STALL_TIMEOUT", "")
    assert env_seconds("HOPBASE_STALL_TIMEOUT", 180) == 180


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "inf", "nan", "1s"])
def test_it_refuses_bad_seconds_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("HOPBASE_STALL_TIMEOUT", raw)
    with pytest.raises(ImproperlyConfigured, match="HOPBASE_STALL_TIMEOUT"):
        env_seconds("HOPBASE_STALL_TIMEOUT", 180)


def test_it_reads_whole_numbers(monkeypatch):
    monkeypatch.setenv("HOPBASE_MAX_BODY_BYTES", "2048")
    assert env_int("HOPBASE_MAX_BODY_BYTES", 1, minimum=1024) == 2048
    monkeypatch.delenv("HOPBASE_MAX_BODY_BYTES")
    assert env_int("HOPBASE_MAX_BODY_BYTES", 4096, minimum=1024) == 4096


@pytest.mark.parametrize("raw", ["1.5", "ten", "12", "-5000"])
def test_it_refuses_bad_whole_numbers(monkeypatch, raw):
    monkeypatch.setenv("HOPBASE_MAX_BODY_BYTES", raw)
    with pytest.raises(ImproperlyConfigured, match="HOPBASE_MAX_BODY_BYTES"):
        env_int("HOPBASE_MAX_BODY_BYTES", 4096, minimum=1024)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("False", False), ("off", False)],
)
def test_it_reads_booleans(monkeypatch, raw, expected):
    monkeypatch.setenv("HOPBASE_DEBUG", raw)
    assert env_bool("HOPBASE_DEBUG", not expected) is expected


def test_it_refuses_a_bad_boolean(monkeypatch):
    monkeypatch.setenv("HOPBASE_DEBUG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="HOPBASE_DEBUG"):
        env_bool("HOPBASE_DEBUG", False)


def test_it_defaults_to_a_sqlite_file_in_the_project():
    config = database_from_url("DATABASE_URL", None)
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["NAME"] == settings.BASE_DIR / "db.sqlite3"


def test_it_reads_a_sqlite_url():
    config = database_from_url("DATABASE_URL", "sqlite:///tmp/hop.db")
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["NAME"] == "/tmp/hop.db"


def test_it_keeps_database_connections_for_a_while_whatever_the_database():
    # Otherwise the log writer opens a connection for every batch.
    for url in (None, "sqlite:///tmp/hop.db", "postgres://u@db:5432/hop"):
        assert database_from_url("DATABASE_URL", url)["CONN_MAX_AGE"] == 60


def test_it_reads_a_postgres_url():
    config = database_from_url("DATABASE_URL", "postgres://bob:p%40ss@db.example:6543/hop")
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("hop", "bob", "p@ss")
    assert (config["HOST"], config["PORT"]) == ("db.example", "6543")
    assert database_from_url("DATABASE_URL", "postgresql://postgres@127.0.0.1/hop")["PORT"] == ""


@pytest.mark.parametrize(
    "url",
    ["mysql://root@localhost/hop", "postgres://postgres@localhost:5432/", "postgres://h:notaport/hop", "sqlite://"],
)
def test_it_refuses_bad_database_urls_naming_the_variable(url):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_from_url("DATABASE_URL", url)


def test_it_reads_redis_urls(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert redis_url("REDIS_URL") is None
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    assert redis_url("REDIS_URL") == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("REDIS_URL", "rediss://cache.example:6380/1")
    assert redis_url("REDIS_URL") == "rediss://cache.example:6380/1"


def test_it_refuses_a_non_redis_url(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "http://127.0.0.1:6379")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        redis_url("REDIS_URL")


def test_it_stops_start_up_on_a_bad_value():
    env = {**os.environ, "HOPBASE_STALL_TIMEOUT": "abc"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "HOPBASE_STALL_TIMEOUT" in result.stderr
    assert "ImproperlyConfigured" in result.stderr
