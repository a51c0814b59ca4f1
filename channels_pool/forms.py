"""The channel form of the admin, and the base-URL check that `addchannel`
shares with it."""

from __future__ import annotations

from urllib.parse import urlsplit

from django import forms
from django.core.exceptions import ValidationError

from channels_pool.models import Channel
from hopbase.forms import ModelListField

BASE_URL_MAX_LENGTH = 500


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


class ChannelForm(forms.ModelForm):
    base_url = forms.CharField(
        label="Base URL",
        max_length=BASE_URL_MAX_LENGTH,
        validators=[validate_base_url],
        help_text=Channel._meta.get_field("base_url").help_text,
    )
    # Write-only: the widget never renders a value, and the stored secret is
    # kept out of the form's initial data so no widget could render it.
    secret = forms.CharField(
        max_length=500,
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The provider API key. Write-only.",
    )
    served_models = ModelListField(help_text="Comma-separated model names this channel serves.")

    class Meta:
        model = Channel
        fields = [
            "name", "protocol", "base_url", "secret", "served_models",
            "priority", "weight", "max_concurrency", "enabled",
        ]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.initial.pop("secret", None)
        if self.instance.pk is None:
            self.fields["secret"].required = True
        else:
            self.fields["secret"].help_text = "The provider API key. Write-only: leave blank to keep the current one."

    def clean_secret(self) -> str:
        secret = self.cleaned_data["secret"]
        if not secret and self.instance.pk is not None:
            return self.instance.secret
        return secret

    def _get_validation_exclusions(self):
        # The model field is a URLField; its validator would refuse the
        # single-label hosts validate_base_url accepts (see its docstring).
        exclusions = super()._get_validation_exclusions()
        exclusions.add("base_url")
        return exclusions
