"""The channel form of the admin: the secret is write-only, and a new base
URL needs the secret typed again."""

from __future__ import annotations

from django import forms

from channels_pool.models import SECRET_MAX_LENGTH, Channel
from core.model_names import ModelListField


class ChannelForm(forms.ModelForm):
    # Write-only: the widget never renders a value, and the stored secret is
    # kept out of the form's initial data so no widget could render it.
    secret = forms.CharField(
        max_length=SECRET_MAX_LENGTH,
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The provider API key. Write-only.",
    )
    served_models = ModelListField(
        aliases=True,
        help_text="Comma-separated model names this channel serves; public=upstream serves the public name by "
                  "sending the upstream name to this channel.",
    )

    class Meta:
        model = Channel
        fields = [
            "name", "protocol", "base_url", "secret", "served_models",
            "priority", "weight", "max_concurrency", "enabled", "cross_protocol",
        ]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.initial.pop("secret", None)
        if self.instance.pk is None:
            self.fields["secret"].required = True
        else:
            self.fields["secret"].help_text = (
                "The provider API key. Write-only: leave blank to keep the current one "
                "(required when the base URL changes)."
            )

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.instance.pk is None or cleaned.get("secret"):
            return cleaned
        if "base_url" in self.changed_data:
            # The stored secret goes only where it went before: whoever moves
            # a channel to another host must know the key it will carry there.
            self.add_error("secret", "Enter the secret again to change the base URL: the stored one is not sent "
                                     "to a new address.")
        else:
            cleaned["secret"] = self.instance.secret  # blank on edit: keep the stored one
        return cleaned
