"""API keys' last use: noted in memory per request, written in the background
in key-id order, only ever moving forward, and not lost to a failed write."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway import key_usage
from gateway.key_usage import KEY_USAGE_INTERVAL, KeyUsage, key_usage_writer, note, usage
from tenants.models import ApiKey
from tests.support.factories import make_key


def last_used(key: ApiKey):
    return ApiKey.objects.get(pk=key.pk).last_used_at


def test_note_keeps_the_latest_time_per_key():
    keys = KeyUsage()
    now = timezone.now()
    keys.note(7, now)
    keys.note(7, now - timedelta(seconds=5))
    keys.note(8, now - timedelta(seconds=5))
    keys.note(8, now)
    assert keys.pending() == {7: now, 8: now}


def test_the_module_note_is_the_process_wide_one():
    assert note == usage.note
    assert key_usage_writer().name == "api-key-last-used"
    assert key_usage_writer()._interval == KEY_USAGE_INTERVAL


@pytest.mark.django_db
def test_it_only_moves_last_used_forward():
    now = timezone.now()
    (fresh, _), (used, _) = make_key(), make_key()
    ApiKey.objects.filter(pk=used.pk).update(last_used_at=now)
    keys = KeyUsage()
    keys.note(fresh.pk, now - timedelta(minutes=1))
    keys.note(used.pk, now - timedelta(minutes=1))  # older than what is stored
    assert keys.write() == 2
    assert last_used(fresh) == now - timedelta(minutes=1)
    assert last_used(used) == now
    keys.note(used.pk, now + timedelta(minutes=1))
    assert keys.write() == 1
    assert last_used(used) == now + timedelta(minutes=1)
    assert keys.pending() == {}
    assert keys.write() == 0  # nothing noted: no query at all


@pytest.mark.django_db
def test_keys_are_written_in_id_order():
    keys_made = sorted((make_key()[0] for _ in range(4)), key=lambda k: k.pk)
    keys = KeyUsage()
    now = timezone.now()
    for key in reversed(keys_made):
        keys.note(key.pk, now)
    with CaptureQueriesContext(connection) as queries:
        keys.write()
    updated = [
        int(match.group(1))
        for query in queries.captured_queries
        if query["sql"].startswith("UPDATE")
        for match in [re.search(r'"id" = (\d+)', query["sql"])]
        if match
    ]
    assert updated == [key.pk for key in keys_made]


@pytest.mark.django_db
def test_what_a_failed_write_could_not_store_is_written_at_the_next_tick(monkeypatch):
    key, _ = make_key()
    keys = KeyUsage()
    then = timezone.now()
    keys.note(key.pk, then)

    class Unreachable:
        class objects:
            @staticmethod
            def filter(**lookups):
                raise RuntimeError("database down")

    with monkeypatch.context() as patched:
        patched.setattr(key_usage, "ApiKey", Unreachable)
        with pytest.raises(RuntimeError):
            keys.write()
    later = then + timedelta(seconds=1)
    keys.note(key.pk, then - timedelta(seconds=1))  # noted meanwhile: older, ignored
    assert keys.pending() == {key.pk: then}
    keys.note(key.pk, later)
    assert keys.write() == 1
    assert last_used(key) == later
