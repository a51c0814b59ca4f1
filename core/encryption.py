"""Secrets at rest: the provider keys of channels, encrypted with Fernet
(AES-128-CBC with HMAC-SHA256, from ``cryptography``), never home-made crypto.

Keys come from ``HOPBASE_ENCRYPTION_KEYS`` (a comma list of Fernet keys: the
first encrypts, every one decrypts, so a key is rotated by putting a new one
first, running ``manage.py rotatekeys``, then dropping the old one). When it
is unset, one key is derived from ``SECRET_KEY`` with HKDF-SHA256, so a
deployment that never set it still keeps no plaintext secret in its
database; such a deployment must then keep its ``SECRET_KEY``.

``EncryptedTextField`` is the model field: plaintext in Python (the relay
reads ``channel.secret``), a Fernet token in the database, and a token
again wherever Django serialises the field (``dumpdata``, fixtures), so a
dump or backup holds no plaintext either.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

# HKDF's context: a key derived for this purpose is good for nothing else.
DERIVATION_SALT = b"hopbase"
DERIVATION_INFO = b"hopbase channel secrets at rest (Fernet) v1"
# Every Fernet token starts with its version byte, 0x80 ("gA" in base64).
TOKEN_VERSION = 0x80
TOKEN_MIN_BYTES = 1 + 8 + 16 + 16 + 32  # version, time, IV, one block, HMAC


class SecretUnreadable(Exception):
    """A stored secret no configured key decrypts. The message names no
    secret; it says what to fix."""


@lru_cache(maxsize=4)
def derived_key(secret_key: str) -> str:
    """The Fernet key derived from ``SECRET_KEY`` (HKDF-SHA256)."""
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=DERIVATION_SALT, info=DERIVATION_INFO).derive(
        secret_key.encode("utf-8")
    )
    return base64.urlsafe_b64encode(raw).decode("ascii")


def is_fernet_key(text: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(text.encode("ascii"))) == 32
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False


def configured_keys() -> tuple[str, ...]:
    keys = tuple(getattr(settings, "HOPBASE_ENCRYPTION_KEYS", ()) or ())
    return keys or (derived_key(settings.SECRET_KEY),)


@lru_cache(maxsize=4)
def _box(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def box() -> MultiFernet:
    return _box(configured_keys())


def encrypt(plaintext: str) -> str:
    """A token of ``plaintext`` under the first key."""
    return box().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """The plaintext of a token made with any configured key."""
    try:
        return box().decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError):
        raise SecretUnreadable(
            "a stored secret cannot be decrypted with HOPBASE_ENCRYPTION_KEYS (or, when that is unset, the key "
            "derived from SECRET_KEY): list the key it was encrypted with"
        ) from None


def looks_like_token(text: str) -> bool:
    """Shaped like a Fernet token (whatever key made it). Provider API keys
    never are; a stored value that is not was written before encryption."""
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False
    return len(raw) >= TOKEN_MIN_BYTES and raw[0] == TOKEN_VERSION


class Unreadable(str):
    """A stored secret no configured key decrypts (added under another
    SECRET_KEY or encryption key): empty as text, so it is never sent
    anywhere, and written back as the token it was, so saving its row for
    another reason loses nothing. Its row still loads: one such row must not
    stop the rest from being read (the channel directory), or deleted."""

    token: str

    def __new__(cls, token: str) -> Unreadable:
        made = super().__new__(cls, "")
        made.token = token
        return made


class EncryptedTextField(models.TextField):
    """Plaintext on the model instance, a Fernet token in the database and
    in serialised output. Lookups by value cannot match (every encryption
    differs); the empty string is stored as it is (nothing to hide). A
    token no key decrypts loads as ``Unreadable``."""

    def from_db_value(self, value, expression, connection):
        if not value:
            return value
        try:
            return decrypt(value)
        except SecretUnreadable:
            return Unreadable(value)

    def get_prep_value(self, value):
        if isinstance(value, Unreadable):
            return value.token
        value = super().get_prep_value(value)
        if not value:
            return value
        return encrypt(value)

    def to_python(self, value):
        # A fixture (loaddata) carries the token dumpdata wrote.
        if isinstance(value, str) and looks_like_token(value):
            return decrypt(value)
        return super().to_python(value)

    def value_to_string(self, obj) -> str:
        value = self.value_from_object(obj)
        return encrypt(value) if value else (value or "")
