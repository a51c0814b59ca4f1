"""Tenants and their API keys: who is calling (request -> *auth*).

Only a SHA-256 hash of each key secret is stored. The secrets are 240 random
bits, so an unkeyed hash is enough to make a stolen table useless, and it
keeps working if SECRET_KEY is rotated.

A key that becomes refused (revoked, or given an expiry) is announced to
every gateway process when its transaction commits (tenants.revocations),
through the actions that can make it so: ``ApiKey.revoke``,
``ApiKeyQuerySet.revoke``, ``ApiKey.amend`` (an operator's edit, its expiry
among it) and ``ApiKey.rotate``. A plain ``save()`` or ``QuerySet.update``
of those fields tells nobody: use these.

A key rotated (``ApiKey.rotate``) keeps its row, so its logs, limits and
budget spend carry on, and takes a new secret; the previous secret keeps
working until the end of the grace period its owner picked
(``previous_until``), then is refused like a revoked key.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenants import revocations

KEY_PREFIX = "hb-"
DISPLAY_PREFIX_LENGTH = 11


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class Tenant(models.Model):
    name = models.CharField(max_length=100, unique=True)
    # Running balance, changed only together with a ledger entry in one
    # transaction (billing.ledger); checkledger proves it equals their sum.
    balance_usd = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal("0"))
    # Discount or surcharge applied to list prices (1 = list price).
    price_multiplier = models.DecimalField(max_digits=8, decimal_places=4, default=Decimal("1"))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        # Crediting money is its own right, apart from editing a tenant (tenants.roles).
        permissions = [("top_up_tenant", "Can top up a tenant's balance")]
        constraints = [
            models.CheckConstraint(condition=Q(price_multiplier__gte=0), name="tenant_multiplier_not_negative"),
            models.CheckConstraint(condition=~Q(name=""), name="tenant_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True)

    def issued_by_operators(self) -> ApiKeyQuerySet:
        return self.filter(made_in_console=False)

    def unexpired(self) -> ApiKeyQuerySet:
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key with this secret (not revoked, not expired), with its
        tenant, or None. The secret is its current one, or its previous one
        within the grace of a rotation."""
        if not secret.startswith(KEY_PREFIX):
            return None
        digest = hash_secret(secret)
        by_secret = Q(key_hash=digest) | Q(previous_hash=digest, previous_until__gt=timezone.now())
        return self.active().unexpired().select_related("tenant").filter(by_secret).first()

    def revoke(self) -> list[ApiKey]:
        """Revoke the keys of this queryset not revoked yet, all at one
        moment, and announce it when the transaction commits; returns the
        keys this call revoked (not those someone revoked meanwhile)."""
        now = timezone.now()
        live = list(self.filter(revoked_at__isnull=True).values_list("pk", flat=True))
        ApiKey.objects.filter(pk__in=live, revoked_at__isnull=True).update(revoked_at=now)
        revoked = list(ApiKey.objects.filter(pk__in=live, revoked_at=now).select_related("tenant"))
        announce_refusals(revoked)
        return revoked

    def issue(self, tenant: Tenant, **fields) -> tuple[ApiKey, str]:
        """Create a key and return it with its secret, which is never stored."""
        secret = new_secret()
        key = self.create(
            tenant=tenant,
            key_hash=hash_secret(secret),
            prefix=secret[:DISPLAY_PREFIX_LENGTH],
            **fields,
        )
        return key, secret


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(30)


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_keys")
    label = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=DISPLAY_PREFIX_LENGTH, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    # Empty list: every model the gateway serves.
    allowed_models = models.JSONField(default=list, blank=True)
    rpm = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute; empty = no limit")
    concurrency = models.PositiveIntegerField(null=True, blank=True, help_text="Open requests; empty = no limit")
    tpm = models.PositiveIntegerField(null=True, blank=True,
                                      help_text="Input and output tokens per sliding minute; empty = no limit")
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this moment the key is refused like a revoked one; empty = never"
    )
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The secret before the last rotation, accepted until previous_until.
    previous_hash = models.CharField(max_length=64, unique=True, null=True, blank=True, editable=False)
    previous_prefix = models.CharField(max_length=DISPLAY_PREFIX_LENGTH, blank=True, editable=False)
    previous_until = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Made by a tenant's owner in the console, within the operator's keys (console.allowance).
    made_in_console = models.BooleanField(default=False, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(rpm__isnull=True) | Q(rpm__gt=0), name="apikey_rpm_positive"),
            models.CheckConstraint(
                condition=Q(concurrency__isnull=True) | Q(concurrency__gt=0), name="apikey_concurrency_positive"
            ),
            models.CheckConstraint(condition=Q(tpm__isnull=True) | Q(tpm__gt=0), name="apikey_tpm_positive"),
            models.CheckConstraint(condition=Q(key_hash__regex=r"^[0-9a-f]{64}$"), name="apikey_hash_is_sha256"),
            models.CheckConstraint(
                condition=Q(previous_hash__isnull=True, previous_until__isnull=True)
                | Q(previous_hash__regex=r"^[0-9a-f]{64}$", previous_until__isnull=False),
                name="apikey_previous_secret_has_an_end",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.label or self.tenant.name})"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def refused_from(self) -> datetime | None:
        """From when the key is refused: the earlier of its revocation and its expiry; None: not so far."""
        moments = [m for m in (self.revoked_at, self.expires_at) if m is not None]
        return min(moments) if moments else None

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def revoke(self) -> None:
        """Refuse the key from now, and tell every gateway process once the transaction commits."""
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
            announce_refusals([self])

    def amend(self, fields: Sequence[str]) -> None:
        """Save an operator's change to ``fields``; a change of the key's
        expiry is told to every gateway process once the transaction commits
        (a key just made is in no process's cache, so ``issue`` tells nobody)."""
        self.save(update_fields=list(fields))
        if "expires_at" in fields:
            announce_refusals([self])

    def rotate(self, grace: timedelta) -> str:
        """Give the key a new secret, returned (never stored); the current
        one stays accepted for ``grace`` (not past the key's own refusal),
        and a secret from an earlier rotation is refused at once."""
        secret = new_secret()
        now = timezone.now()
        earlier = revocations.Refusal(self.previous_hash, now.timestamp(), self.previous_prefix) \
            if self.previous_hash else None
        self.previous_hash, self.previous_prefix = self.key_hash, self.prefix
        self.previous_until = min(m for m in (now + grace, self.refused_from) if m is not None)
        self.key_hash, self.prefix = hash_secret(secret), secret[:DISPLAY_PREFIX_LENGTH]
        self.save(update_fields=["key_hash", "prefix", "previous_hash", "previous_prefix", "previous_until"])
        announce_refusals([self])
        if earlier is not None:  # no longer the previous secret: refused from now
            revocations.announce([earlier])
        return secret

    def secret_refused_from(self, digest: str) -> datetime | None:
        """From when the secret with this hash (current or previous) is refused; None: not so far."""
        if digest != self.previous_hash:
            return self.refused_from
        return min(m for m in (self.previous_until, self.refused_from) if m is not None)

    def secret_prefix(self, digest: str) -> str:
        return self.previous_prefix if digest == self.previous_hash else self.prefix


def refusals_of(key: ApiKey) -> list[revocations.Refusal]:
    """From when each secret of ``key`` is refused (those that are)."""
    refusals = []
    if key.refused_from is not None:
        refusals.append(revocations.Refusal(key.key_hash, key.refused_from.timestamp(), key.prefix))
    if key.previous_hash:
        end = key.secret_refused_from(key.previous_hash)
        refusals.append(revocations.Refusal(key.previous_hash, end.timestamp(), key.previous_prefix))
    return refusals


def announce_refusals(keys: Iterable[ApiKey]) -> None:
    """Tell every gateway process, once the transaction commits, from when
    each of these keys' secrets is refused (those that are)."""
    revocations.announce([refusal for key in keys for refusal in refusals_of(key)])
