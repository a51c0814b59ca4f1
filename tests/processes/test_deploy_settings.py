"""Deployment settings: SECRET_KEY required, narrow
ALLOWED_HOSTS by default, TLS settings behind a proxy, and ``manage.py check
--deploy`` clean for the production settings docs/configuration.md documents. Each case
starts Django afresh in a process of its own, on hopbase.settings itself."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import httpx
import pytest
from django.conf import settings

# Everything a deployment sets, as docs/configuration.md documents it.
PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "hopbase.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://hopbase.example.com",
    "HOPBASE_BEHIND_TLS": "1",
    "HOPBASE_TRUSTED_PROXIES": "10.0.0.5",
}
READ = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({name: getattr(s, name) for name in %r}))"
)


def environment(**values: str) -> dict[str, str]:
    """The test run's environment without any deployment setting, plus ``values``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "REDIS_URL")
           and not k.startswith("HOPBASE_")}
    return {**env, "DJANGO_SETTINGS_MODULE": "hopbase.settings", "HOPBASE_SPOOL_DIR": os.environ["HOPBASE_SPOOL_DIR"],
            **values}


def run(args: list[str], **values: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=settings.BASE_DIR, env=environment(**values), capture_output=True, text=True,
                          timeout=60)


def read(*names: str, **values: str) -> dict:
    done = run([sys.executable, "-c", READ % (names,)], **values)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_start_up_refuses_without_a_secret_key_naming_it():
    done = run([sys.executable, "manage.py", "check"])
    assert done.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set" in done.stderr
    assert "HOPBASE_DEBUG=1" in done.stderr


def test_development_runs_without_one_with_hopbase_debug():
    assert read("DEBUG", "SECRET_KEY", HOPBASE_DEBUG="1")["DEBUG"] is True
    assert run([sys.executable, "manage.py", "check"], HOPBASE_DEBUG="1").returncode == 0


def test_defaults_are_narrow_and_plain_http():
    found = read("ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
                 "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER", "SECURE_SSL_REDIRECT", "DEBUG",
                 "HOPBASE_TRUSTED_PROXIES", "AUTH_PASSWORD_VALIDATORS", SECRET_KEY="k" * 50)
    assert found["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]
    assert found["CSRF_TRUSTED_ORIGINS"] == [] and found["HOPBASE_TRUSTED_PROXIES"] == []
    assert (found["SESSION_COOKIE_SECURE"], found["CSRF_COOKIE_SECURE"], found["SECURE_SSL_REDIRECT"]) == (
        False, False, False)
    assert (found["SECURE_HSTS_SECONDS"], found["SECURE_PROXY_SSL_HEADER"], found["DEBUG"]) == (0, None, False)
    assert len(found["AUTH_PASSWORD_VALIDATORS"]) == 4


def test_behind_tls_cookies_are_secure_hsts_is_on_and_the_proxy_gives_the_scheme():
    found = read("ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
                 "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_PROXY_SSL_HEADER",
                 "SECURE_SSL_REDIRECT", "HOPBASE_TRUSTED_PROXIES", **PRODUCTION)
    assert found["ALLOWED_HOSTS"] == ["hopbase.example.com"]
    assert found["CSRF_TRUSTED_ORIGINS"] == ["https://hopbase.example.com"]
    assert found["SESSION_COOKIE_SECURE"] is found["CSRF_COOKIE_SECURE"] is True
    assert found["SECURE_HSTS_SECONDS"] == 365 * 24 * 3600 and found["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert found["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert found["SECURE_SSL_REDIRECT"] is False  # the proxy redirects
    assert found["HOPBASE_TRUSTED_PROXIES"] == ["10.0.0.5/32"]
    assert read("SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", **PRODUCTION, HOPBASE_SSL_REDIRECT="1",
                HOPBASE_HSTS_SECONDS="600") == {"SECURE_SSL_REDIRECT": True, "SECURE_HSTS_SECONDS": 600}


def test_check_deploy_passes_for_the_documented_production_settings():
    done = run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "System check identified no issues" in done.stdout
    # With Django's own redirect too.
    done = run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION,
               HOPBASE_SSL_REDIRECT="1")
    assert done.returncode == 0, done.stderr + done.stdout


def test_check_deploy_still_warns_about_a_plain_http_deployment():
    done = run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
               SECRET_KEY=PRODUCTION["SECRET_KEY"])
    assert done.returncode != 0
    for warning in ("security.W004", "security.W012", "security.W016"):  # HSTS, session and CSRF cookies
        assert warning in done.stderr


@pytest.mark.gateway
def test_the_api_takes_any_host_and_the_admin_only_allowed_ones(gateway, world):
    api = httpx.get(f"{gateway.url}/v1/models", headers={"host": "api.customer-dns.example",
                                                         "authorization": f"Bearer {world.key}"})
    assert api.status_code == 200
    assert httpx.get(f"{gateway.url}/healthz", headers={"host": "anything.example"}).status_code == 200
    assert httpx.get(f"{gateway.url}/admin/login/", headers={"host": "evil.example"}).status_code == 400
    assert httpx.get(f"{gateway.url}/admin/login/").status_code == 200  # 127.0.0.1 is allowed
