"""Upstream channels: provider accounts that serve models (-> *channel choice*)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from channels_pool.destinations import LocalDestination, check_destination
from core.encryption import EncryptedTextField
from core.model_names import split_alias
from core.vocabulary import ChannelKindName
from providers.kind import ConfigError
from providers.kinds import KINDS

BASE_URL_MAX_LENGTH = 500
# Of the plaintext: a Vertex service-account JSON key is about 2,400 characters.
SECRET_MAX_LENGTH = 8192


def validate_base_url(value: str) -> str:
    """http(s) with a host. Broader than Django's URLValidator on purpose: a
    channel may live at a single-label host such as a compose service name
    (http://simulator:9000/v1), which URLValidator refuses for want of a TLD."""
    url = value.strip()
    if not url:
        raise ValidationError("a base URL is required")
    if len(url) > BASE_URL_MAX_LENGTH:
        raise ValidationError(f"longer than {BASE_URL_MAX_LENGTH} characters")
    if any(ch.isspace() for ch in url):
        raise ValidationError(f"{url!r} contains whitespace")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValidationError(f"{url!r} is not an http:// or https:// URL")
    try:
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise ValidationError(f"{url!r} has a bad port") from None
    if not host:
        raise ValidationError(f"{url!r} names no host")
    if parts.query or parts.fragment:
        raise ValidationError(f"{url!r}: a base URL takes no query or fragment")
    return url


class ChannelQuerySet(models.QuerySet):
    def enabled(self) -> ChannelQuerySet:
        return self.filter(enabled=True)

    def serving(self, model: str) -> list[Channel]:
        # Model lists are JSON arrays; containment lookups differ between
        # SQLite and PostgreSQL, and the channel table is small.
        return [channel for channel in self if model in channel.model_map()]


class Channel(models.Model):
    name = models.CharField(max_length=100, unique=True)
    protocol = models.CharField(
        "kind", max_length=16, choices=ChannelKindName.choices,
        help_text="A vendor's own API, or the cloud the capacity is on",
    )
    base_url = models.CharField(
        max_length=BASE_URL_MAX_LENGTH,
        validators=[validate_base_url],
        help_text=(
            "As the provider's SDK takes it: OpenAI http://host:port/v1; Anthropic and Gemini http://host:port; "
            "Azure https://NAME.openai.azure.com; Bedrock https://bedrock-runtime.REGION.amazonaws.com; "
            "Vertex https://LOCATION-aiplatform.googleapis.com"
        ),
    )
    # Plaintext on the instance, a Fernet token in the database and in dumps.
    secret = EncryptedTextField(
        blank=True,
        validators=[MaxLengthValidator(SECRET_MAX_LENGTH)],
        help_text=(
            "The provider API key; Bedrock: ACCESS_KEY_ID:SECRET[:SESSION_TOKEN], a Bedrock API key, or empty for "
            "the gateway's own AWS credentials; Vertex: the service-account JSON key. Write-only; encrypted at rest."
        ),
    )
    # What a cloud kind needs beside its URL and key (rule C6).
    region = models.CharField(max_length=40, blank=True, help_text="Bedrock: the AWS region")
    project = models.CharField(max_length=100, blank=True, help_text="Vertex: the Google Cloud project")
    location = models.CharField(max_length=40, blank=True, help_text="Vertex: the region, or global")
    api_version = models.CharField(max_length=40, blank=True, help_text="Azure: the API version (empty: a current GA one)")
    # Entries are names or aliases, public=upstream (core.model_names).
    served_models = models.JSONField(default=list, help_text="Model names this channel serves")
    # Upstream names this channel serves on OpenAI's Responses API alone (the
    # gpt-5-codex class refuses Chat Completions): clients of the other APIs
    # reach them translated to Responses (providers.legs).
    responses_only = models.JSONField(default=list, blank=True,
                                      help_text="Models served on /v1/responses only (openai and azure channels)")
    priority = models.IntegerField(default=0, help_text="Higher is tried first")
    weight = models.PositiveIntegerField(default=1, help_text="Share among channels of equal priority")
    max_concurrency = models.PositiveIntegerField(null=True, blank=True, help_text="Empty = no limit")
    enabled = models.BooleanField(default=True)
    cross_protocol = models.BooleanField(
        "serves other APIs", default=True,
        help_text="Also serve clients of the other APIs, translated (off: only its own protocol's clients)",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = ChannelQuerySet.as_manager()

    class Meta:
        ordering = ["-priority", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(protocol__in=ChannelKindName.values), name="channel_protocol_known"),
            models.CheckConstraint(condition=Q(weight__gt=0), name="channel_weight_positive"),
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True) | Q(max_concurrency__gt=0),
                name="channel_max_concurrency_positive",
            ),
            models.CheckConstraint(condition=~Q(name=""), name="channel_name_not_empty"),
            models.CheckConstraint(
                condition=Q(base_url__startswith="http://") | Q(base_url__startswith="https://"),
                name="channel_base_url_is_http",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def settings(self) -> dict[str, str]:
        """The kind's own settings (region, project, location, API version)."""
        return {"region": self.region, "project": self.project, "location": self.location, "api_version": self.api_version}

    def clean(self) -> None:
        super().clean()
        kind = KINDS.get(self.protocol)
        if kind is None:
            return  # the field's own choices report it
        if kind.secret_required and not self.secret:
            article = "An" if kind.name[0] in "aeiou" else "A"
            raise ValidationError({"secret": f"{article} {kind.name} channel needs a key."})
        try:
            kind.check(self.base_url, self.secret, self.settings())
            check_destination(self.base_url)
        except ConfigError as error:
            raise ValidationError({"secret" if error.field == "api_key" else error.field: error.message}) from None
        except LocalDestination as error:
            raise ValidationError({"base_url": str(error)}) from None

    def model_map(self) -> dict[str, str]:
        """Public model name -> the name this channel is sent."""
        return dict(split_alias(entry) for entry in self.served_models or ())


class ChannelHealth(models.Model):
    """A channel's recent record, fed by the relay's attempts."""

    class State(models.TextChoices):
        CLOSED = "closed", "Closed (healthy)"
        OPEN = "open", "Open (skipped)"
        HALF_OPEN = "half_open", "Half-open (on trial)"

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, related_name="health", primary_key=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CLOSED)
    successes = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_error_kind = models.CharField(max_length=40, blank=True)
    # For operators only: the provider's own words (a refused credential, say).
    last_error = models.CharField(max_length=300, blank=True)
    recent_success_pct = models.PositiveSmallIntegerField(null=True, blank=True)
    median_ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    open_until = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "channel health"

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.state}"


STATE_ID_MAX_LENGTH = 255


class ProviderState(models.Model):
    """Which tenant created a piece of provider-held state (P9): a Responses
    id or a Gemini cache name. A request naming another tenant's is refused
    (channels_pool.provider_state); the row outlives any cache of it."""

    state_id = models.CharField(max_length=STATE_ID_MAX_LENGTH, unique=True)
    tenant = models.ForeignKey("hopbase.Tenant", on_delete=models.PROTECT, related_name="+")
    channel = models.ForeignKey(Channel, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "provider state"
        constraints = [models.CheckConstraint(condition=~Q(state_id=""), name="provider_state_id_not_empty")]

    def __str__(self) -> str:
        return self.state_id
