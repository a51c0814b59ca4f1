"""Model names as operators write them: one comma-separated line, parsed
the same way by the admin's forms and the operator commands."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

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
