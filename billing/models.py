"""The money side: prices, request logs and the append-only ledger
(-> metering -> *settlement*)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from channels_pool.models import Channel
from core.encryption import EncryptedTextField
from core.row_insert import insert_rows
from core.vocabulary import RequestStatus
from tenants.models import ApiKey, Tenant

USD = {"max_digits": 20, "decimal_places": 10}
PRICE = {"max_digits": 14, "decimal_places": 6}


class ModelPriceQuerySet(models.QuerySet):
    def in_force(self, at=None) -> dict[str, ModelPrice]:
        """The price of each model at a moment (now by default)."""
        at = at or timezone.now()
        prices: dict[str, ModelPrice] = {}
        for price in self.filter(effective_from__lte=at).order_by("model", "effective_from"):
            prices[price.model] = price
        return prices


def valid_extras(value: object) -> None:
    """A price's surcharges (B10): feature -> a multiplier of the token
    charge, an exact decimal string from 0 to 100 with at most 4 places."""
    if not isinstance(value, dict):
        raise ValidationError("Surcharges are an object: feature -> multiplier.")
    for feature, multiplier in value.items():
        if not isinstance(feature, str) or not 0 < len(feature) <= 60 or not isinstance(multiplier, str):
            raise ValidationError(f"{feature!r}: give the multiplier as a decimal string, e.g. \"1.5\".")
        try:
            number = Decimal(multiplier)
        except ArithmeticError:
            raise ValidationError(f"{feature}: {multiplier!r} is not a decimal number.") from None
        if not number.is_finite() or not 0 <= number <= 100 or number.as_tuple().exponent < -4:
            raise ValidationError(f"{feature}: the multiplier must be from 0 to 100, with at most 4 decimal places.")


class ModelPrice(models.Model):
    """USD per million tokens. A new price is a new row from a moment on, so a
    change never rewrites what earlier requests cost."""

    model = models.CharField(max_length=200)
    input_usd_per_mtok = models.DecimalField(**PRICE)
    output_usd_per_mtok = models.DecimalField(**PRICE)
    cache_read_usd_per_mtok = models.DecimalField(**PRICE, default=Decimal("0"))
    cache_write_usd_per_mtok = models.DecimalField(**PRICE, default=Decimal("0"))
    # The most output tokens one answer of the model can have (G7): what a
    # request naming no limit is reserved for. Empty: HOPBASE_DEFAULT_OUTPUT_CAP.
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Surcharges the operator allows on this model (B10, core.surcharges):
    # feature -> multiplier of the token charge, as an exact decimal string.
    extras = models.JSONField(default=dict, blank=True, validators=[valid_extras])
    effective_from = models.DateTimeField(default=timezone.now)

    objects = ModelPriceQuerySet.as_manager()

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["model", "effective_from"], name="one_price_per_model_and_moment"),
            models.CheckConstraint(
                condition=Q(input_usd_per_mtok__gte=0)
                & Q(output_usd_per_mtok__gte=0)
                & Q(cache_read_usd_per_mtok__gte=0)
                & Q(cache_write_usd_per_mtok__gte=0),
                name="price_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M}"


class RequestLogQuerySet(models.QuerySet):
    def insert_new(self, rows: Sequence[RequestLog]) -> None:
        """Insert ``rows``, leaving out any whose ``request_id`` is stored
        already (a record replayed from the spool), with one statement run
        for the whole batch: the recorder writes a row for every request."""
        insert_rows(rows, skip_existing="request_id", using=self.db)


class RequestLog(models.Model):
    Status = RequestStatus

    request_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="request_logs")
    api_key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="request_logs", null=True)
    model = models.CharField(max_length=200, blank=True)  # the public name (T4)
    # The name the serving channel was sent, when an alias made it another.
    upstream_model = models.CharField(max_length=200, blank=True)
    provider_request_id = models.CharField(max_length=100, blank=True)
    channel = models.ForeignKey(Channel, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    protocol = models.CharField(max_length=16)
    endpoint = models.CharField(max_length=32, blank=True)
    stream = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices)
    error_kind = models.CharField(max_length=40, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Billable tokens (input_tokens is uncached input; thinking is inside output).
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    thinking_tokens = models.PositiveBigIntegerField(default=0)
    usage_estimated = models.BooleanField(default=False)
    # What an estimate is made from when a stream is cut short.
    prompt_chars = models.PositiveBigIntegerField(default=0)
    sent_chars = models.PositiveBigIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    upstream_status = models.PositiveSmallIntegerField(null=True, blank=True)
    # The tenant's price multiplier when the request was made (null: rows
    # from before it was recorded, which use the tenant's current one).
    price_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    # The surcharges priced into price_multiplier (B10), e.g. "service_tier:priority x2".
    extras = models.CharField(max_length=200, blank=True, default="")
    charge_usd = models.DecimalField(**USD, null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = RequestLogQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="log_tenant_time"),
            models.Index(fields=["status", "-created_at"], name="log_status_time"),
            # The console's filters (console.logs): a tenant's rows of one model or status, newest
            # first, found without reading its other rows (a rare or absent model or status included).
            models.Index(fields=["tenant", "model", "-created_at"], name="log_tenant_model_time"),
            models.Index(fields=["tenant", "status", "-created_at"], name="log_tenant_status_time"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RequestStatus.values), name="log_status_known"),
        ]

    def __str__(self) -> str:
        return self.request_id


class LedgerKind(models.TextChoices):
    TOPUP = "topup"
    CHARGE = "charge"
    ADJUSTMENT = "adjustment"


class LedgerEntry(models.Model):
    """Append-only: a mistake is corrected by an adjustment, never an edit."""

    Kind = LedgerKind

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="ledger_entries")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Signed: top-ups positive, charges negative.
    amount_usd = models.DecimalField(**USD)
    balance_after_usd = models.DecimalField(**USD)
    # unique: a request log is charged at most once, whatever retries happen.
    request_log = models.OneToOneField(
        RequestLog, on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_entry"
    )
    note = models.CharField(max_length=200, blank=True)
    # A top-up form's one-time token: the same form sent twice credits once.
    idempotency_key = models.CharField(max_length=64, unique=True, null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name_plural = "ledger entries"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=LedgerKind.values), name="ledger_kind_known"),
            models.CheckConstraint(
                condition=~Q(kind="charge") | (Q(request_log__isnull=False) & Q(amount_usd__lte=0)),
                name="charge_has_log_and_is_debit",
            ),
            models.CheckConstraint(condition=~Q(kind="topup") | Q(amount_usd__gt=0), name="topup_is_credit"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_usd} {self.tenant_id}"


class BudgetQuerySet(models.QuerySet):
    def covering(self, tenant_id: int, key_id: int) -> BudgetQuerySet:
        """The budgets a request of this key spends against: its tenant's and its own (G1)."""
        return self.filter(Q(api_key__isnull=True) | Q(api_key_id=key_id), tenant_id=tenant_id)


class Budget(models.Model):
    """A USD budget per period on a tenant, or on one of its keys (G1).
    One per scope and period; the alert threshold and webhook are G4's."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets",
                                help_text="Empty: the whole tenant's budget")
    period = models.CharField(max_length=16, help_text="1h, 1d, 1w, 1mo, total, or a number of seconds (30s)")
    limit_usd = models.DecimalField(**USD)
    alert_at_pct = models.PositiveSmallIntegerField(null=True, blank=True,
                                                    help_text="Alert when this percent of the limit is spent")
    webhook_url = models.URLField(max_length=500, blank=True)
    # The HMAC key of the webhook's signature, shown once (setbudget); encrypted at rest.
    webhook_secret = EncryptedTextField(blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = BudgetQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "api_key_id", "period"]
        constraints = [
            models.CheckConstraint(condition=Q(limit_usd__gte=0), name="budget_limit_not_negative"),
            models.CheckConstraint(condition=Q(alert_at_pct__isnull=True)
                                   | (Q(alert_at_pct__gte=1) & Q(alert_at_pct__lte=100)), name="budget_alert_pct_1_100"),
            models.CheckConstraint(condition=~Q(period=""), name="budget_period_not_empty"),
            models.UniqueConstraint(fields=["tenant", "period"], condition=Q(api_key__isnull=True),
                                    name="budget_one_per_tenant_period"),
            models.UniqueConstraint(fields=["api_key", "period"], condition=Q(api_key__isnull=False),
                                    name="budget_one_per_key_period"),
        ]

    def __str__(self) -> str:
        return f"{self.scope_name} {self.period} budget of {self.limit_usd.normalize():f} USD"

    @property
    def scope(self) -> str:
        return "tenant" if self.api_key_id is None else "key"

    @property
    def scope_name(self) -> str:
        return f"key {self.api_key.prefix}" if self.api_key_id is not None else f"tenant {self.tenant.name}"


class AlertType(models.TextChoices):
    THRESHOLD = "budget.threshold"
    EXHAUSTED = "budget.exhausted"


class BudgetAlert(models.Model):
    """One G4 event: at most one per budget, type and window (the
    constraint), its body written once so every retry sends the same bytes."""

    id = models.UUIDField(primary_key=True, editable=False)
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    type = models.CharField(max_length=32, choices=AlertType.choices)
    window_start = models.DateTimeField()
    body = models.TextField(editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    delivered_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "type", "window_start"], name="budget_alert_once_per_window"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


class WebhookAttempt(models.Model):
    """One delivery attempt of an alert, as the admin shows it."""

    alert = models.ForeignKey(BudgetAlert, on_delete=models.CASCADE, related_name="attempts")
    attempted_at = models.DateTimeField(default=timezone.now, editable=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)  # None: no answer
    error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-attempted_at"]
