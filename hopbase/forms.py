"""Forms for the operator side of tenants and keys (the admin), and the
model-list parsing that the admin and the management commands share."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.core.exceptions import ValidationError

from hopbase.models import ApiKey

MODEL_NAME_MAX_LENGTH = 200  # RequestLog.model and ModelPrice.model


def parse_model_names(text: str) -> list[str]:
    """'a, b,,a' -> ['a', 'b']: comma-separated, blanks dropped, first
    occurrence kept. An empty result is the caller's to judge."""
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        if any(ch.isspace() for ch in name):
            raise ValidationError(f"model name {name!r} contains whitespace")
        if len(name) > MODEL_NAME_MAX_LENGTH:
            raise ValidationError(f"model name {name[:40]!r}… is longer than {MODEL_NAME_MAX_LENGTH} characters")
        if name not in names:
            names.append(name)
    return names


def parse_required_model_names(text: str) -> list[str]:
    names = parse_model_names(text)
    if not names:
        raise ValidationError("name at least one model")
    return names


class ModelListField(forms.CharField):
    """A JSON list of model names, edited as one comma-separated line."""

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value) -> list[str]:  # type: ignore[override]
        if isinstance(value, list):
            return value
        return parse_model_names(super().to_python(value))


class ApiKeyForm(forms.ModelForm):
    allowed_models = ModelListField(
        required=False,
        help_text="Comma-separated model names; empty allows every model the gateway serves.",
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "label", "allowed_models", "rpm", "concurrency"]


class TopUpForm(forms.Form):
    amount_usd = forms.DecimalField(
        label="Amount (USD)",
        max_digits=20,
        decimal_places=10,
        min_value=Decimal("0.0000000001"),
        help_text="Credited to the tenant as a ledger entry.",
    )
    note = forms.CharField(max_length=200, required=False, help_text="Shown on the ledger entry.")
