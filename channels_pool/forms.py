"""The channel form of the admin: the secret is write-only."""

from __future__ import annotations

from django import forms

from channels_pool.models import Channel
from core.model_names import ModelListField


class ChannelForm(forms.ModelForm):
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
