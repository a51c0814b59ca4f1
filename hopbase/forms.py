"""Forms for the operator side of tenants and keys (the admin)."""

from __future__ import annotations

import secrets
from decimal import Decimal

from django import forms

from core.model_names import ModelListField
from tenants.models import ApiKey


class ApiKeyForm(forms.ModelForm):
    allowed_models = ModelListField(
        required=False,
        help_text="Comma-separated model names; empty allows every model the gateway serves.",
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "label", "allowed_models", "rpm", "concurrency", "tpm"]


class TopUpForm(forms.Form):
    amount_usd = forms.DecimalField(
        label="Amount (USD)",
        max_digits=20,
        decimal_places=10,
        min_value=Decimal("0.0000000001"),
        help_text="Credited to the tenant as a ledger entry.",
    )
    note = forms.CharField(max_length=200, required=False, help_text="Shown on the ledger entry.")
    # One per rendered form (billing.ledger.top_up_once): sent twice, it credits once.
    token = forms.CharField(widget=forms.HiddenInput, min_length=16, max_length=64,
                            error_messages={"required": "This form has expired: open the top-up page again."})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial["token"] = secrets.token_urlsafe(24)
