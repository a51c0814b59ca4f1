"""What the operator-command tests share: running a command, and checking that a
refused command fails with one line and writes nothing, no audit row and no
user for its actor included (tests/*/test_commands_*.py)."""

from __future__ import annotations

import io

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from billing.models import Budget, LedgerEntry, ModelPrice, RequestLog
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant

ALL_MODELS = (Tenant, ApiKey, Channel, ModelPrice, LedgerEntry, RequestLog, Budget)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (*ALL_MODELS, LogEntry, get_user_model())}


def assert_refused(*args: str, match: str) -> CommandError:
    """The command fails with one clear line and writes nothing."""
    before = counts()
    with pytest.raises(CommandError, match=match) as caught:
        run(*args)
    message = str(caught.value)
    assert message and "\n" not in message
    assert counts() == before
    return caught.value
