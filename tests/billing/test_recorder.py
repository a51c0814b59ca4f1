"""The recorder: one request log per finished request, written in batches
off the event loop, and not lost to one bad row or a dead writer. It only
records: keys' last use, channel health and the sweep run elsewhere
(serving.background)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.finished import Finished
from billing.models import RequestLog
from billing.recorder import Recorder, to_row
from billing.spool import replay_dead
from core.usage import Usage
from tenants.models import Tenant
from tests.support.factories import make_channel, make_key


def finished(key, **fields) -> Finished:
    values = dict(
        request_id="req_" + uuid.uuid4().hex,
        created_at=timezone.now(),
        tenant_id=key.tenant_id,
        api_key_id=key.pk,
        protocol="chat",
        status="completed",
        model="gpt-test",
        usage=Usage(10, 5, input_reported=True, output_reported=True),
    )
    values.update(fields)
    return Finished(**values)


def written(items: list[Finished]) -> dict[str, RequestLog]:
    return {log.request_id: log for log in RequestLog.objects.filter(request_id__in=[i.request_id for i in items])}


@pytest.mark.usefixtures("committed_db")
def test_a_row_whose_channel_was_deleted_is_kept_without_its_channel():
    # Committed for real: foreign keys are checked when a transaction commits.
    key, _ = make_key()
    kept, gone = make_channel(), make_channel()
    batch = [finished(key, channel_id=kept.pk), finished(key, channel_id=gone.pk), finished(key)]
    gone.delete()
    Recorder(publish=lambda ids: None)._write(batch)
    logs = written(batch)
    assert len(logs) == 3
    assert logs[batch[0].request_id].channel_id == kept.pk
    assert logs[batch[1].request_id].channel_id is None
    assert logs[batch[1].request_id].input_tokens == 10


class Journal:
    """The spool's side the recorder talks to: what it was told is written,
    and where refused records are set aside."""

    def __init__(self, directory: Path | None = None) -> None:
        self.written: list[str] = []
        self.directory = directory

    def committed(self, request_ids: list[str]) -> None:
        self.written += request_ids


@pytest.mark.usefixtures("committed_db")
def test_a_row_the_database_refuses_is_set_aside_and_offered_again_until_it_lands(tmp_path, caplog):
    key, _ = make_key()
    orphan = finished(key, tenant_id=987_654)  # no such tenant (yet): the database refuses its row
    batch = [finished(key), orphan, finished(key)]
    journal = Journal(tmp_path)
    recorder = Recorder(publish=lambda ids: None, spool=journal)
    recorder._write(batch)
    assert set(written(batch)) == {batch[0].request_id, batch[2].request_id}
    assert journal.written == [item.request_id for item in batch]  # its segment may go: the record is set aside
    assert "set aside in the spool" in caplog.text and orphan.request_id in caplog.text
    # Offered again with dead processes' records: refused again, set aside again, never dropped.
    assert replay_dead(tmp_path, recorder.write_now) == 1
    assert orphan.request_id not in written([orphan])
    (again,) = tmp_path.glob("*.spool")
    assert orphan.request_id.encode() in again.read_bytes()
    # Once what refused it is mended, the next replay writes it, once.
    Tenant.objects.create(pk=987_654, name="late")
    assert replay_dead(tmp_path, recorder.write_now) == 1
    assert list(written([orphan])) == [orphan.request_id] and not list(tmp_path.glob("*.spool"))


@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("count", [-1_000_000, 10**30, 10**9, 2.5, "12", True])
def test_a_providers_impossible_count_is_billed_on_the_estimate_and_still_written(count):
    key, _ = make_key()
    usage = Usage(10, 5, input_reported=True, output_reported=True)
    usage.output_tokens = count
    item = finished(key, usage=usage, prompt_chars=400, sent_chars=80)
    journal = Journal()
    Recorder(publish=lambda ids: None, spool=journal)._write([item])
    row = written([item])[item.request_id]
    assert (row.input_tokens, row.output_tokens, row.usage_estimated) == (100, 20, True)
    assert journal.written == [item.request_id]


@pytest.mark.usefixtures("committed_db")
def test_a_nul_in_a_model_name_does_not_lose_the_row():
    key, _ = make_key()
    item = finished(key, model="gpt\x00evil" + "x" * 300, status="rejected", usage=Usage())
    Recorder(publish=lambda ids: None, spool=Journal())._write([item])
    row = written([item])[item.request_id]
    assert row.model.startswith("gpt\ufffdevil") and len(row.model) == 200


@pytest.mark.usefixtures("committed_db")
def test_the_writer_thread_survives_a_bad_request_and_writes_the_next():
    key, _ = make_key()
    recorder = Recorder(publish=lambda ids: None)
    bad, good = finished(key, created_at=None), finished(key)
    recorder.record(bad)
    assert recorder.flush(10)
    recorder.record(good)
    assert recorder.flush(10)
    recorder.stop()
    assert list(written([bad, good])) == [good.request_id]


@pytest.mark.django_db
def test_a_batch_touches_request_logs_only(django_capture_on_commit_callbacks):
    key, _ = make_key()
    batch = [finished(key), finished(key)]
    published: list[list[int]] = []
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        Recorder(publish=published.append)._write(batch)
    assert len(written(batch)) == 2
    assert [sorted(ids) for ids in published] == [sorted(log.pk for log in written(batch).values())]
    tables = {table for query in queries.captured_queries for table in ("apikey", "channelhealth") if table in query["sql"]}
    assert tables == set()
    key.refresh_from_db()
    assert key.last_used_at is None


@pytest.mark.django_db
def test_a_record_written_again_leaves_the_first_row_as_it_was():
    # A spool replay may write a record the database already has.
    key, _ = make_key()
    first = finished(key, status="interrupted")
    recorder = Recorder(publish=lambda ids: None)
    recorder._write([first])
    again = finished(key, request_id=first.request_id, status="completed", usage=Usage(99, 99))
    recorder._write([again, finished(key)])
    rows = RequestLog.objects.filter(request_id=first.request_id)
    assert [(row.status, row.input_tokens) for row in rows] == [("interrupted", 10)]
    assert RequestLog.objects.filter(tenant_id=key.tenant_id).count() == 2


@pytest.mark.django_db
def test_every_value_is_stored_as_the_row_had_it():
    key, _ = make_key()
    channel = make_channel()
    item = finished(
        key, channel_id=channel.pk, stream=True, status="stalled", error_kind="stall", attempts=2,
        upstream_model="gpt-upstream", provider_request_id="req-up-1", prompt_chars=1234, sent_chars=56,
        ttft_ms=321, duration_ms=4567, upstream_status=200, price_multiplier=Decimal("1.2345"),
        created_at=timezone.now().replace(microsecond=123456),
    )
    expected = to_row(item)
    Recorder(publish=lambda ids: None)._write([item])
    stored = RequestLog.objects.get(request_id=item.request_id)
    fields = [field.attname for field in RequestLog._meta.concrete_fields if not field.primary_key]
    assert {name: getattr(stored, name) for name in fields} == {name: getattr(expected, name) for name in fields}


@pytest.mark.usefixtures("committed_db")
def test_records_within_one_flush_interval_are_written_as_one_batch(settings):
    settings.HOPBASE_LOG_FLUSH_INTERVAL = 0.5
    key, _ = make_key()
    published: list[list[int]] = []
    recorder = Recorder(publish=published.append)
    items = [finished(key) for _ in range(20)]
    for item in items:
        recorder.record(item)
    assert recorder.flush(10)
    recorder.stop()
    assert len(written(items)) == 20
    assert [len(ids) for ids in published] == [20]


@pytest.mark.usefixtures("committed_db")
def test_stopping_writes_what_is_queued_without_waiting_out_the_interval(settings):
    settings.HOPBASE_LOG_FLUSH_INTERVAL = 60
    key, _ = make_key()
    recorder = Recorder(publish=lambda ids: None)
    item = finished(key)
    recorder.record(item)
    recorder.stop(timeout=10)
    assert list(written([item])) == [item.request_id]
    assert recorder.flush(0)
