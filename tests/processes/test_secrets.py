"""Channel secrets at rest (core.encryption): Fernet tokens
in the database, in dumps and backups; plaintext only on the model instance
and in the relay's ChannelInfo; rotation; the admin's base-URL rule."""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse

from channels_pool.models import Channel
from channels_pool.selection import _load as load_channels
from core import encryption
from hopbase.settings import env_fernet_keys
from tests.support.factories import make_channel, make_key, make_log, make_tenant

SECRET = "sk-live-PLAINTEXT-never-stored-7f3a9c"
ROOT = Path(__file__).resolve().parents[2]

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()


def stored(channel: Channel) -> str:
    """The column as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM channels_pool_channel WHERE id = %s", [channel.pk])
        return cursor.fetchone()[0]


# The cipher


def test_a_secret_round_trips_and_every_token_differs():
    first, second = encryption.encrypt(SECRET), encryption.encrypt(SECRET)
    assert first != second and SECRET not in first
    assert encryption.looks_like_token(first)
    assert encryption.decrypt(first) == encryption.decrypt(second) == SECRET


def test_the_first_key_encrypts_and_every_key_decrypts(settings):
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_B,)
    old = encryption.encrypt(SECRET)
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_A, KEY_B)
    new = encryption.encrypt(SECRET)
    assert encryption.decrypt(old) == encryption.decrypt(new) == SECRET
    assert Fernet(KEY_A).decrypt(new.encode()) == SECRET.encode()  # made with the first
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_A,)
    with pytest.raises(encryption.SecretUnreadable) as caught:
        encryption.decrypt(old)
    assert "HOPBASE_ENCRYPTION_KEYS" in str(caught.value)
    assert SECRET not in str(caught.value) and old not in str(caught.value)


def test_without_keys_one_is_derived_from_the_secret_key_with_hkdf(settings):
    settings.HOPBASE_ENCRYPTION_KEYS = ()
    derived = encryption.derived_key(settings.SECRET_KEY)
    assert encryption.configured_keys() == (derived,)
    assert encryption.is_fernet_key(derived)
    assert derived != encryption.derived_key(settings.SECRET_KEY + "x")
    token = encryption.encrypt(SECRET)
    assert Fernet(derived).decrypt(token.encode()) == SECRET.encode()
    settings.SECRET_KEY = "another-secret-key-entirely-0123456789-abcdefghijklmnop"
    with pytest.raises(encryption.SecretUnreadable):
        encryption.decrypt(token)


def test_the_keys_setting_refuses_what_is_not_a_fernet_key_without_echoing_it(monkeypatch):
    monkeypatch.setenv("HOPBASE_ENCRYPTION_KEYS", f" {KEY_A} , {KEY_B} ")
    assert env_fernet_keys("HOPBASE_ENCRYPTION_KEYS") == (KEY_A, KEY_B)
    monkeypatch.setenv("HOPBASE_ENCRYPTION_KEYS", f"{KEY_A},not-a-key-but-secret-ish")
    with pytest.raises(ImproperlyConfigured, match="HOPBASE_ENCRYPTION_KEYS: entry 2") as caught:
        env_fernet_keys("HOPBASE_ENCRYPTION_KEYS")
    assert "not-a-key-but-secret-ish" not in str(caught.value)


# In the database and what Django writes out


@pytest.mark.django_db
def test_the_database_holds_a_token_and_the_model_the_plaintext():
    channel = make_channel(secret=SECRET)
    raw = stored(channel)
    assert SECRET not in raw and encryption.looks_like_token(raw)
    assert encryption.decrypt(raw) == SECRET
    assert Channel.objects.get(pk=channel.pk).secret == SECRET
    assert SECRET not in repr(channel) and SECRET not in str(channel)
    assert not Channel.objects.filter(secret=SECRET).exists()  # lookups never see the plaintext


@pytest.mark.django_db
def test_dumpdata_writes_tokens_and_loaddata_reads_them(tmp_path):
    channel = make_channel("dumped", secret=SECRET)
    for fmt in ("json", "xml", "jsonl"):
        out = io.StringIO()
        call_command("dumpdata", "channels_pool.channel", format=fmt, stdout=out)
        assert SECRET not in out.getvalue()
        assert "dumped" in out.getvalue()
    fixture = tmp_path / "channels.json"
    call_command("dumpdata", "channels_pool.channel", output=str(fixture))
    Channel.objects.filter(pk=channel.pk).update(secret="sk-overwritten")
    call_command("loaddata", str(fixture), verbosity=0)
    assert Channel.objects.get(pk=channel.pk).secret == SECRET
    assert SECRET not in stored(channel)


@pytest.mark.django_db
def test_the_relay_reads_the_plaintext_which_no_repr_shows():
    make_channel("relayed", secret=SECRET, served_models=["m-secret"])
    infos = [c for c in load_channels() if c.name == "relayed"]  # what ChannelDirectory holds
    assert infos[0].secret == SECRET
    assert SECRET not in repr(infos[0])


@pytest.mark.django_db
def test_exports_and_logs_never_carry_the_secret(caplog):
    tenant = make_tenant()
    key, _ = make_key(tenant)
    channel = make_channel(secret=SECRET)
    make_log(tenant, key, channel=channel)
    caplog.set_level(logging.DEBUG)
    out = io.StringIO()
    call_command("exportbilling", "--format", "jsonl", stdout=out)
    call_command("rotatekeys", stdout=out)
    call_command("dumpdata", stdout=out)
    assert channel.name in out.getvalue()
    assert SECRET not in out.getvalue()
    assert SECRET not in caplog.text


# Rotation


@pytest.mark.django_db
def test_rotatekeys_re_encrypts_every_secret_with_the_first_key(settings):
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_B,)
    channels = [make_channel(secret=f"{SECRET}-{n}") for n in range(3)]
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_A, KEY_B)
    out = io.StringIO()
    call_command("rotatekeys", stdout=out)
    assert "re-encrypted 3 channel secret(s)" in out.getvalue()
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_A,)  # the old key dropped
    for n, channel in enumerate(channels):
        assert Fernet(KEY_A).decrypt(stored(channel).encode()).decode() == f"{SECRET}-{n}"
        assert Channel.objects.get(pk=channel.pk).secret == f"{SECRET}-{n}"


@pytest.mark.django_db
def test_rotatekeys_encrypts_plaintext_and_names_what_it_cannot_read(settings):
    readable = make_channel("readable", secret=SECRET)
    unreadable = make_channel("lost-key", secret="sk-other")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s",
                       [Fernet(KEY_B).encrypt(b"sk-other").decode(), unreadable.pk])
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s", [SECRET, readable.pk])
    out = io.StringIO()
    with pytest.raises(CommandError, match="lost-key") as caught:
        call_command("rotatekeys", stdout=out)
    assert "\n" not in str(caught.value)
    assert "encrypted 1 stored in plaintext" in out.getvalue()
    assert encryption.decrypt(stored(readable)) == SECRET


@pytest.mark.django_db
def test_rotatekeys_prints_the_derived_key_to_move_to_keys_of_ones_own(settings):
    out = io.StringIO()
    call_command("rotatekeys", "--derived-key", stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == encryption.derived_key(settings.SECRET_KEY)


# The admin: write-only, and a new base URL needs the secret again

CHANNEL_FORM = {
    "name": "up-1", "protocol": "openai", "base_url": "http://upstream.example:9000/v1", "served_models": "gpt-a",
    "priority": "0", "weight": "1", "max_concurrency": "", "enabled": "on",
    "health-TOTAL_FORMS": "0", "health-INITIAL_FORMS": "0", "health-MIN_NUM_FORMS": "0", "health-MAX_NUM_FORMS": "1",
}


@pytest.fixture
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_a_new_base_url_without_the_secret_is_refused(admin_client):
    channel = make_channel("up-1", secret=SECRET, base_url=CHANNEL_FORM["base_url"])
    url = reverse("admin:channels_pool_channel_change", args=[channel.pk])
    moved = {**CHANNEL_FORM, "base_url": "https://attacker.example/v1", "secret": ""}
    response = admin_client.post(url, moved)
    assert response.status_code == 200
    assert "Enter the secret again to change the base URL" in response.content.decode()
    channel.refresh_from_db()
    assert (channel.base_url, channel.secret) == (CHANNEL_FORM["base_url"], SECRET)
    # With the secret typed again it may move.
    response = admin_client.post(url, {**moved, "secret": "sk-for-the-new-host"})
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.base_url, channel.secret) == ("https://attacker.example/v1", "sk-for-the-new-host")
    # Any other change keeps the stored secret without asking for it.
    response = admin_client.post(url, {**moved, "secret": "", "priority": "7"})
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.priority, channel.secret) == (7, "sk-for-the-new-host")


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_no_admin_page_shows_the_secret_or_its_token(admin_client):
    channel = make_channel("shown", secret=SECRET)
    token = stored(channel)
    admin_client.post(reverse("admin:channels_pool_channel_change", args=[channel.pk]),
                      {**CHANNEL_FORM, "name": "shown", "base_url": channel.base_url, "secret": SECRET})
    pages = [
        reverse("admin:channels_pool_channel_changelist"),
        reverse("admin:channels_pool_channel_change", args=[channel.pk]),
        reverse("admin:channels_pool_channel_history", args=[channel.pk]),
        reverse("admin:channels_pool_channel_delete", args=[channel.pk]),
        reverse("admin:admin_logentry_changelist"),
        reverse("admin:index"),
    ]
    for page in pages:
        response = admin_client.get(page)
        body = response.content.decode()
        # The page rendered, and about this channel where it is one of its pages.
        assert response.status_code == 200, (page, response.status_code)
        assert "shown" in body or page in (reverse("admin:admin_logentry_changelist"), reverse("admin:index")), page
        assert SECRET not in body and token not in body, page


# A whole deployment: the database file itself, the dump, the data migration


def manage(database: Path, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", **env}
    environment.pop("REDIS_URL", None)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=environment, input=stdin,
                          capture_output=True, text=True, timeout=120, check=True)


def file_bytes(database: Path) -> bytes:
    # The main file, the write-ahead log and anything else SQLite keeps beside it.
    return b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))


def test_the_database_file_and_dump_hold_no_plaintext_secret_and_old_ones_are_encrypted(tmp_path):
    database = tmp_path / "hb.sqlite3"
    # A database from before encryption, with a plaintext secret in it.
    manage(database, "migrate", "channels_pool", "0002", "--verbosity", "0")
    with closing(sqlite3.connect(database)) as db, db:
        db.execute(
            "INSERT INTO channels_pool_channel (name, protocol, base_url, secret, served_models, priority, weight,"
            " enabled, created_at) VALUES ('old', 'openai', 'http://x/v1', ?, '[]', 0, 1, 1, '2026-01-01')",
            ["sk-from-before-encryption-1234"],
        )
    assert b"sk-from-before-encryption-1234" in file_bytes(database)
    manage(database, "migrate", "--verbosity", "0")
    manage(database, "addchannel", "new", "--protocol", "anthropic", "--base-url", "http://y",
           "--api-key", SECRET, "--models", "m1")
    manage(database, "rotatekeys")
    assert SECRET.encode() not in file_bytes(database)  # never written in plaintext
    # The plaintext the migration replaced may linger in freed pages until
    # the database is vacuumed (docs/operations.md says so); then it is gone too.
    manage(database, "shell", "-c", "from django.db import connection; connection.cursor().execute('VACUUM')")
    contents = file_bytes(database)
    assert SECRET.encode() not in contents
    assert b"sk-from-before-encryption-1234" not in contents
    dump = manage(database, "dumpdata").stdout
    assert SECRET not in dump and "sk-from-before-encryption-1234" not in dump
    read = "from channels_pool.models import Channel; print(sorted(Channel.objects.values_list('secret', flat=True)))"
    shown = manage(database, "shell", "-c", read)
    assert shown.stdout.strip().splitlines()[-1] == repr(sorted([SECRET, "sk-from-before-encryption-1234"]))
    # Going back decrypts them again.
    manage(database, "migrate", "channels_pool", "0002", "--verbosity", "0")
    with closing(sqlite3.connect(database)) as db:
        assert {row[0] for row in db.execute("SELECT secret FROM channels_pool_channel")} == {
            SECRET, "sk-from-before-encryption-1234"}


# A secret no key decrypts: skipped, shown, deletable


def lose_the_key(channel: Channel) -> str:
    token = Fernet(KEY_B).encrypt(b"sk-other").decode()  # a key this gateway does not have
    with connection.cursor() as cursor:
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s", [token, channel.pk])
    return token


@pytest.mark.django_db
def test_a_channel_whose_secret_cannot_be_read_is_skipped_and_the_rest_serve(caplog):
    good = make_channel("good", secret=SECRET)
    broken = make_channel("lost-key", secret="sk-other")
    lose_the_key(broken)
    with caplog.at_level(logging.ERROR, logger="hopbase.channels"):
        loaded = load_channels()
    assert [c.name for c in loaded] == [good.name]
    assert "lost-key is skipped" in caplog.text and "sk-other" not in caplog.text


@pytest.mark.django_db
def test_an_unreadable_channel_is_shown_broken_kept_on_save_and_can_be_deleted(admin_client):
    broken = make_channel("lost-key", secret="sk-other")
    token = lose_the_key(broken)
    listing = admin_client.get(reverse("admin:channels_pool_channel_changelist"))
    assert listing.status_code == 200 and "secret unreadable" in listing.content.decode()
    page = admin_client.get(reverse("admin:channels_pool_channel_change", args=[broken.pk]))
    assert page.status_code == 200 and "UNREADABLE" in page.content.decode()
    channel = Channel.objects.get(pk=broken.pk)
    channel.priority = 5
    channel.save()
    assert stored(channel) == token  # saved for another reason: the token is kept as it was
    deleted = admin_client.post(reverse("admin:channels_pool_channel_delete", args=[broken.pk]), {"post": "yes"})
    assert deleted.status_code == 302 and not Channel.objects.filter(pk=broken.pk).exists()
