"""Recording finished requests: one RequestLog row per request (P8).

The relay hands a ``Finished`` record to ``record()``, which writes it to the
spool on disk (billing.spool: one ``os.write``, so it survives the death of
the process) and appends it to a queue: it never waits on the database and
works from a cancelled task's ``finally``. One writer thread per process
turns the queue into batched inserts, applying metering on the way, tells
the spool what is written, and logs a line per request.

After each batch commits, its ids go to settlement (billing.tasks.Publisher:
a Celery message per batch, or, without REDIS_URL, settlement run right here
in eager mode). Publishing happens on this thread, never the event loop, and
gives up fast when the broker is down: the sweep settles those logs later.

That is all this thread does, so a database outage it waits out (retrying
every couple of seconds, for as long as it lasts) holds up nothing else. The gateway's other background
work runs on threads of its own (serving.background): the in-process sweep
(billing.jobs), channel health (channels_pool.jobs) and keys' last use
(gateway.key_usage).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)

from billing.finished import Finished
from billing.metering import billable_tokens
from billing.models import RequestLog
from billing.spool import Spool, set_aside
from billing.tasks import publisher
from core import loggers
from core.lifecycle import daemon_call, flush_when_drained
from core.snapshots import refresh_connection
from core.vocabulary import ApiName, RequestStatus

log = logging.getLogger(loggers.REQUESTS)


def log_fields(item: Finished) -> dict[str, object]:
    """The request's log line (one a request, from HopBase): no secret, and
    of the key only its display prefix."""
    tokens = billable_tokens(item.status, item.usage, item.prompt_chars, item.sent_chars)
    return {
        "request_id": item.request_id,
        "tenant_id": item.tenant_id,
        "key_prefix": item.key_prefix,
        "protocol": ApiName(item.protocol).value,
        "model": item.model,
        "upstream_model": item.upstream_model if item.upstream_model != item.model else None,
        "provider_request_id": item.provider_request_id or None,
        "stream": item.stream,
        "channel": item.channel_name or None,
        "status": RequestStatus(item.status).value,
        "error_kind": item.error_kind or None,
        "attempts": item.attempts,
        "ttft_ms": item.ttft_ms,
        "duration_ms": item.duration_ms,
        "input_tokens": tokens.input_tokens,
        "output_tokens": tokens.output_tokens,
        "cache_read_tokens": tokens.cache_read_tokens,
        "cache_write_tokens": tokens.cache_write_tokens,
        "usage_estimated": tokens.estimated,
    }


def _text(value: str, length: int) -> str:
    """A client's or provider's string as a column takes it (B11): PostgreSQL
    refuses a NUL character, and the column's length is a limit."""
    return value.replace("\x00", "\ufffd")[:length] if "\x00" in value else value[:length]


def to_row(item: Finished) -> RequestLog:
    tokens = billable_tokens(item.status, item.usage, item.prompt_chars, item.sent_chars)
    return RequestLog(
        request_id=item.request_id,
        created_at=item.created_at,
        tenant_id=item.tenant_id,
        api_key_id=item.api_key_id,
        model=_text(item.model, 200),
        upstream_model=_text(item.upstream_model, 200) if item.upstream_model != item.model else "",
        provider_request_id=_text(item.provider_request_id, 100),
        channel_id=item.channel_id,
        protocol=item.protocol,
        stream=item.stream,
        status=item.status,
        error_kind=item.error_kind,
        attempts=item.attempts,
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        cache_read_tokens=tokens.cache_read_tokens,
        cache_write_tokens=tokens.cache_write_tokens,
        thinking_tokens=tokens.thinking_tokens,
        usage_estimated=tokens.estimated,
        prompt_chars=item.prompt_chars,
        sent_chars=item.sent_chars,
        ttft_ms=item.ttft_ms,
        duration_ms=item.duration_ms,
        upstream_status=item.upstream_status,
        price_multiplier=item.price_multiplier,
        extras=_text(item.extras, 200),
    )


_STOP = object()
# A database outage is waited out for as long as it lasts, retrying this often.
MAX_RETRY_DELAY = 2.0
# The longest a drain waits for the request logs to be written.
DRAIN_FLUSH_TIMEOUT = 10.0


class Recorder:
    BATCH = 500

    def __init__(self, publish: Callable[[list[int]], object] = publisher.publish, spool: Spool | None = None) -> None:
        self._queue: queue.SimpleQueue[Finished | object | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._written = threading.Condition(self._lock)
        self._publish = publish
        self._spool = spool
        self._stopping = threading.Event()  # cuts a batch's wait short

    @property
    def spool(self) -> Spool:
        if self._spool is None:
            self._spool = Spool(settings.HOPBASE_SPOOL_DIR, settings.HOPBASE_SPOOL_MAX_BYTES)
            atexit.register(self._spool.close)
        return self._spool

    def record(self, item: Finished) -> None:
        """A request's final record: on disk at once, in the database soon."""
        self._journal(lambda: self.spool.final(item))
        with self._lock:
            self._pending += 1
        self._queue.put(item)
        if self._thread is None:
            self._start()

    def track(self, request_id: str, snapshot: Callable[[], Finished]) -> None:
        """A stream in flight, journalled so that its process's death still
        leaves its row."""
        self._journal(lambda: self.spool.track(request_id, snapshot))

    def progress(self, item: Finished) -> None:
        self._journal(lambda: self.spool.progress(item))

    @staticmethod
    def _journal(write: Callable[[], None]) -> None:
        try:
            write()
        except Exception:
            # A broken disk (or record) must not lose the request: it still
            # reaches the database through the queue.
            log.exception("could not write the request spool")

    def write_now(self, items: list[Finished]) -> bool:
        """Write records read back from a spool, here and now; False if the
        database cannot take them yet."""
        try:
            refresh_connection()
            try:
                self._insert([to_row(item) for item in items])
            except (OperationalError, InterfaceError):
                raise
            except Exception:
                # One bad row (its channel gone, a value out of range) must
                # not hold up the others, nor every later replay: set aside.
                self._set_aside(self._insert_one_by_one(items))
        except (OperationalError, InterfaceError):
            connections.close_all()
            return False
        return True

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hopbase-recorder", daemon=True)
                self._thread.start()
                atexit.register(self.flush)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            stopping = first is _STOP
            batch = [first] if isinstance(first, Finished) else []
            # A deadline for the batch, not a gap between arrivals: under
            # steady traffic the first record would otherwise wait for 500.
            # The thread sleeps until the deadline rather than waking for
            # each record: a wake-up takes the GIL from the event loop.
            deadline = time.monotonic() + settings.HOPBASE_LOG_FLUSH_INTERVAL
            while batch and len(batch) < self.BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopping.wait(left):
                        break
                    continue
                if item is _STOP:
                    stopping = True
                    break
                if isinstance(item, Finished):
                    batch.append(item)
            if batch:
                try:
                    self._write(batch)
                except Exception:
                    log.exception("request log writer failed on a batch of %d", len(batch))
                finally:
                    with self._lock:
                        self._pending -= len(batch)
                        self._written.notify_all()
        connections.close_all()

    def _write(self, batch: list[Finished]) -> None:
        """Insert a batch; never lose it to one bad row or a short outage.

        A row the batch insert refuses (its channel deleted meanwhile) is
        retried alone, then without its channel; a database that is down is
        retried with backoff. What still cannot be written after that is set
        aside in the spool (B11, ``spool.set_aside``), logged in full, and
        offered again with dead processes' records, never dropped."""
        delay = 0.25
        while True:
            try:
                refresh_connection()
                try:
                    self._insert([to_row(item) for item in batch])
                except (OperationalError, InterfaceError):
                    raise
                except Exception:
                    log.exception("could not write a batch of %d request logs; trying one by one", len(batch))
                    # Rows written before an outage here are written again
                    # (ignored: request_id is unique) when the batch is retried.
                    self._set_aside(self._insert_one_by_one(batch))
                break
            except (OperationalError, InterfaceError):
                # The records are safe in the spool; keep trying, never more
                # than a couple of seconds apart, so they arrive soon after
                # the database does.
                if delay >= MAX_RETRY_DELAY:
                    log.warning("database unavailable; %d request logs wait", len(batch))
                connections.close_all()
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
        self.spool.committed([item.request_id for item in batch])
        if not log.isEnabledFor(logging.INFO):
            return  # no request lines at this log level: nothing to build them for
        for item in batch:
            try:
                fields = log_fields(item)
            except Exception:  # a record that could not be written has been logged in full already
                continue
            log.info("request %s %s", item.request_id, fields["status"], extra={"fields": fields})

    def _insert(self, rows: list[RequestLog]) -> None:
        with transaction.atomic():
            RequestLog.objects.insert_new(rows)
            # Rows left out as stored already are still to be settled if they
            # are not yet: ask for the ids of all of them.
            ids = list(
                RequestLog.objects.filter(request_id__in=[row.request_id for row in rows], settled_at__isnull=True)
                .values_list("pk", flat=True)
            )
            # robust: a settlement failure must not look like a failed write.
            transaction.on_commit(lambda: self._publish(ids), robust=True)

    def _insert_one_by_one(self, batch: list[Finished]) -> list[Finished]:
        """Each row alone; those the database still refuses."""
        kept: list[Finished] = []
        for item in batch:
            try:
                row = to_row(item)
                try:
                    self._insert([row])
                except IntegrityError:
                    # Most likely its channel was deleted in the meantime.
                    row.channel_id = None
                    self._insert([row])
            except (OperationalError, InterfaceError):
                raise  # the database, not the row: retried with the batch
            except Exception:
                log.exception("request log refused by the database, set aside in the spool: %r", item)
                kept.append(item)
        return kept

    def _set_aside(self, refused: list[Finished]) -> None:
        if refused:
            set_aside(self.spool.directory, refused)

    def flush(self, timeout: float = 10) -> bool:
        """Wait until everything recorded so far is written (or given up on)."""
        with self._lock:
            return self._written.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, timeout: float = 10) -> None:
        """Write what is queued, then end the thread (and its connection)."""
        thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            self._stopping.set()
            thread.join(timeout)


recorder = Recorder()


async def request_logs_written() -> None:
    """The request logs of a drained process, written before it exits (the
    drain's own log line, not a request's, if they are not)."""
    if not await asyncio.wrap_future(daemon_call(recorder.flush, DRAIN_FLUSH_TIMEOUT)):
        logging.getLogger(loggers.LIFECYCLE).error(
            "drain: request logs not all written within %.0f s", DRAIN_FLUSH_TIMEOUT)


flush_when_drained(request_logs_written, last=True)
