"""Model names as operators write them: one comma-separated line, parsed
the same way by the admin's forms and the operator commands.

A channel's entry may also be an alias, ``public=upstream``: the public name
(what clients ask for, and what logs, exports and metrics show) served by
sending the upstream name to that channel.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

MODEL_NAME_MAX_LENGTH = 200  # RequestLog.model and ModelPrice.model


def _checked_name(name: str) -> str:
    if not name:
        raise ValidationError("a model alias needs a name on both sides of '='")
    if any(ch.isspace() for ch in name):
        raise ValidationError(f"model name {name!r} contains whitespace")
    if "=" in name:
        raise ValidationError(f"model name {name!r} contains '=' (an alias is public=upstream, on channels only)")
    if len(name) > MODEL_NAME_MAX_LENGTH:
        raise ValidationError(f"model name {name[:40]!r}… is longer than {MODEL_NAME_MAX_LENGTH} characters")
    return name


def _entries(text: str, aliases: bool) -> list[str]:
    entries: list[str] = []
    publics: set[str] = set()
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            continue
        public, eq, upstream = entry.partition("=") if aliases else (entry, "", "")
        public = _checked_name(public.strip())
        if eq:
            entry = f"{public}={_checked_name(upstream.strip())}"
        if public not in publics:
            publics.add(public)
            entries.append(entry)
    return entries


def parse_model_names(text: str) -> list[str]:
    """'a, b,,a' -> ['a', 'b']: comma-separated, blanks dropped, first
    occurrence kept. An empty result is the caller's to judge."""
    return _entries(text, aliases=False)


def parse_channel_models(text: str) -> list[str]:
    """A channel's models: 'a, b=x' -> ['a', 'b=x'] (names and aliases; the
    first entry for each public name kept); at least one."""
    entries = _entries(text, aliases=True)
    if not entries:
        raise ValidationError("name at least one model")
    return entries


def split_alias(entry: str) -> tuple[str, str]:
    """'public=upstream' -> ('public', 'upstream'); 'name' -> ('name', 'name')."""
    public, _, upstream = entry.partition("=")
    return public, upstream or public


def parse_required_model_names(text: str) -> list[str]:
    names = parse_model_names(text)
    if not names:
        raise ValidationError("name at least one model")
    return names


class ModelListField(forms.CharField):
    """A JSON list of model names, edited as one comma-separated line."""

    def __init__(self, *args, aliases: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parse = parse_channel_models if aliases else parse_model_names

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value) -> list[str]:  # type: ignore[override]
        if isinstance(value, list):
            return value
        return self.parse(super().to_python(value))
