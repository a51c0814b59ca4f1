"""The channel form of the admin (rule C6).

The secret is write-only: no widget ever renders it, a blank field on edit
keeps the stored one (a masked hint says whether one is stored), and a new
base URL needs it typed again. The form carries every kind's settings; the
page shows those of the chosen kind (``kind_fields``, read by the change
form's script), the others are cleared on save, and the kind's own rules
(``Channel.clean``) name the field at fault.
"""

from __future__ import annotations

from django import forms

from channels_pool.models import SECRET_MAX_LENGTH, Channel
from core.encryption import Unreadable
from core.model_names import ModelListField
from providers.kinds import KINDS
from providers.openai.azure import DEFAULT_API_VERSION

SETTINGS = ("region", "project", "location", "api_version")
STORED = "•••• set"
SECRET_HELP = (
    "The provider API key; Bedrock: ACCESS_KEY_ID:SECRET[:SESSION_TOKEN], a Bedrock API key, or empty for the "
    "gateway's own AWS credentials; Vertex: the service-account JSON key. Write-only; encrypted at rest."
)


class ChannelForm(forms.ModelForm):
    # Write-only: the widget never renders a value, and the stored secret is
    # kept out of the form's initial data so no widget could render it. One
    # line takes a pasted JSON key too (its line breaks are only whitespace).
    secret = forms.CharField(
        max_length=SECRET_MAX_LENGTH,
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=SECRET_HELP,
    )
    clear_secret = forms.BooleanField(
        label="Remove the stored key", required=False,
        help_text="Bedrock: sign with the gateway's own AWS credentials instead.",
    )
    served_models = ModelListField(
        aliases=True,
        help_text="Comma-separated model names this channel serves; public=upstream serves the public name by "
                  "sending the upstream name to this channel (Azure: the deployment; Bedrock: the model id or "
                  "inference profile).",
    )

    responses_only = ModelListField(
        required=False,
        help_text="OpenAI and Azure: comma-separated upstream model names served on /v1/responses only (the "
                  "gpt-5-codex class); clients of the other APIs reach them translated to Responses. HopBase "
                  "also learns one when the provider refuses Chat Completions for it.",
    )

    class Meta:
        model = Channel
        fields = [
            "name", "protocol", "base_url", *SETTINGS, "secret", "clear_secret", "served_models", "responses_only",
            "priority", "weight", "max_concurrency", "enabled", "cross_protocol",
        ]
        widgets = {"api_version": forms.TextInput(attrs={"placeholder": DEFAULT_API_VERSION})}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.initial.pop("secret", None)
        if self.instance.pk is None:
            del self.fields["clear_secret"]  # nothing stored to remove
            return
        if isinstance(self.instance.secret, Unreadable):
            hint = ("Stored, but UNREADABLE: it was encrypted with a key this gateway does not have, so the channel "
                    "is skipped. Enter it again, or list that key in HOPBASE_ENCRYPTION_KEYS.")
        else:
            hint = f"Stored: {STORED}." if self.instance.secret else "None stored."
        self.fields["secret"].help_text = (
            f"{hint} Write-only: leave blank to keep it (required when the base URL changes). {SECRET_HELP}"
        )

    @property
    def kind_fields(self) -> dict[str, dict[str, object]]:
        """Per kind, the settings rows the page shows and whether its key may be removed (it needs none)."""
        return {name: {"settings": list(kind.settings), "keyless": not kind.secret_required}
                for name, kind in KINDS.items()}

    def clean(self) -> dict:
        cleaned = super().clean()
        kind = KINDS.get(cleaned.get("protocol") or "")
        if kind is not None:
            # The rows the page hid for this kind may still hold what was
            # typed before the kind was changed: not this kind's to keep,
            # nor to refuse the form for (an error on a hidden row).
            for name in SETTINGS:
                if name not in kind.settings:
                    cleaned[name] = ""
                    self._errors.pop(name, None)
        if self.instance.pk is None or cleaned.get("secret"):
            if cleaned.get("clear_secret"):
                self.add_error("clear_secret", "Either type a new key or remove the stored one, not both.")
            return cleaned
        if cleaned.get("clear_secret"):
            cleaned["secret"] = ""  # the kind's rules (Channel.clean) say whether it may go without
        elif "base_url" in self.changed_data and self.instance.secret:
            # The stored secret goes only where it went before: whoever moves
            # a channel to another host must know the key it will carry there.
            self.add_error("secret", "Enter the secret again to change the base URL: the stored one is not sent "
                                     "to a new address.")
        else:
            cleaned["secret"] = self.instance.secret  # blank on edit: keep the stored one
        return cleaned
