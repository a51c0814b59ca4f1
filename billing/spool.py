"""The journal on disk of request records not yet in the database (D2).

Every record the gateway makes goes here first, with one plain ``os.write``
(no fsync: it survives the death of the process, not of the machine), and
only then to the recorder's queue; the relay records a request *before* its
last bytes go to the client. Streams in flight are journalled when they
commit and then every few seconds (``progress``), so a killed stream still
becomes a row, ``interrupted``, billed for at least its last progress.

Files: one segment at a time per process, ``<pid>-<n>.spool`` under
HOPBASE_SPOOL_DIR, each locked (``flock``) while its process lives; a file
nobody holds the lock on belongs to a dead process. A segment is deleted
once every final record in it is in the database; when a segment is
closed for a new one, the streams still in flight are journalled again in
the new one, so an old segment never holds the only trace of a live stream.

``replay_dead`` (run by each gateway process at start-up and periodically)
turns dead processes' files into rows, idempotently (``request_id`` is
unique), then deletes them. The spool's size is bounded: past
HOPBASE_SPOOL_MAX_BYTES, ``full`` is true and the gateway refuses new
requests (an alarm, never a silent drop).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from billing.finished import Finished
from core import loggers
from core.vocabulary import RequestStatus

log = logging.getLogger(loggers.SPOOL)

FINAL = b"F"
PROGRESS = b"P"
SEGMENT_BYTES = 8 * 1024 * 1024
SUFFIX = ".spool"

# This process's id, kept current across fork(): asking the kernel for it on
# every record cost more than writing the record.
_process_id = os.getpid()


def _forked() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_forked)


@dataclass
class Segment:
    path: Path
    fd: int
    size: int = 0
    pending: set[str] = field(default_factory=set)  # final records not yet in the database


class Spool:
    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._segments: list[Segment] = []  # the last one is written to
        self._home: dict[str, Segment] = {}  # request id -> segment of its final record
        self._in_flight: dict[str, Callable[[], Finished]] = {}
        self._count = 0
        self._pid = 0
        self._size = 0  # bytes in the segments not yet deleted

    # -- writing -----------------------------------------------------------

    def final(self, item: Finished) -> None:
        """A request's last record: it is pending until ``committed``."""
        with self._lock:
            self._in_flight.pop(item.request_id, None)
            self._append(FINAL, item)

    def progress(self, item: Finished) -> None:
        with self._lock:
            self._append(PROGRESS, item)

    def track(self, request_id: str, snapshot: Callable[[], Finished]) -> None:
        """A stream in flight: journalled again in each new segment until
        its final record is written."""
        with self._lock:
            self._in_flight[request_id] = snapshot
            self._append(PROGRESS, snapshot())

    def committed(self, request_ids: list[str]) -> None:
        """These final records are in the database: delete what is done."""
        with self._lock:
            for request_id in request_ids:
                segment = self._home.pop(request_id, None)
                if segment is not None:
                    segment.pending.discard(request_id)
            self._prune()

    @property
    def size(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        return self.size >= self.max_bytes

    def _append(self, kind: bytes, item: Finished) -> None:
        segment = self._writable()
        self._write_line(segment, kind + item.to_json() + b"\n")
        if kind == FINAL:
            segment.pending.add(item.request_id)
            self._home[item.request_id] = segment
        if segment.size >= self.segment_bytes:
            self._rotate()

    def _write_line(self, segment: Segment, line: bytes) -> None:
        """Append one record's line. ``os.write`` may take only part of it (a
        signal, a nearly full disk): the rest follows. A line that cannot be
        finished (the disk full) is taken back off the file, so that the next
        record does not start on the end of a cut one."""
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(segment.fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.size)
            raise
        segment.size += len(line)
        self._size += len(line)

    def _writable(self) -> Segment:
        if _process_id != self._pid:
            # A forked child (manage.py serve's workers) must not share its
            # parent's files or locks.
            if self._pid:  # a fork: the parent's streams are the parent's to journal
                self._in_flight = {}
            self._segments, self._home, self._pid, self._size = [], {}, _process_id, 0
        if not self._segments:
            self._open_segment()
        return self._segments[-1]

    def _open_segment(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._count += 1
        # A random part: a later process may be given a dead one's pid.
        path = self.directory / f"{self._pid}-{secrets.token_hex(4)}-{self._count}{SUFFIX}"
        # Locked before it has its name: a replayer must never see an
        # unlocked segment of a living process (and delete it as dead).
        creating = path.with_suffix(".creating")
        fd = os.open(creating, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(creating, path)
        self._segments.append(Segment(path, fd))

    def _rotate(self) -> None:
        self._open_segment()
        current = self._segments[-1]
        for snapshot in self._in_flight.values():
            self._write_line(current, PROGRESS + snapshot().to_json() + b"\n")
        self._prune()

    def _prune(self) -> None:
        """Delete closed segments whose final records are all in the database."""
        keep = []
        for segment in self._segments[:-1]:
            if segment.pending:
                keep.append(segment)
            else:
                self._size -= segment.size
                _delete(segment)
        self._segments = keep + self._segments[-1:]

    def close(self) -> None:
        """At a clean exit: delete the segments with nothing left pending."""
        with self._lock:
            if _process_id != self._pid:
                return
            for segment in self._segments:
                if segment.pending or (segment is self._segments[-1] and self._in_flight):
                    os.close(segment.fd)  # the next gateway replays it
                else:
                    _delete(segment)
            self._segments = []


def _delete(segment: Segment) -> None:
    segment.path.unlink(missing_ok=True)
    os.close(segment.fd)


def read_segment(path: Path) -> list[Finished]:
    return read_segments([path])


def read_segments(paths: list[Path]) -> list[Finished]:
    """What a dead process's segments say, read together: each request's
    final record from whichever segment holds it, or else its latest
    progress as an ``interrupted`` request (``failed`` if it never delivered
    content). A torn line (the process died while writing it) is skipped."""
    finals: dict[str, Finished] = {}
    latest: dict[str, Finished] = {}
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                item = Finished.from_json(orjson.loads(line[1:]))
            except (ValueError, TypeError, KeyError):
                continue
            if line[:1] == FINAL:
                finals[item.request_id] = item
            elif line[:1] == PROGRESS:
                known = latest.get(item.request_id)
                if known is None or item.duration_ms >= known.duration_ms:
                    latest[item.request_id] = item
    for request_id, item in latest.items():
        if request_id not in finals:
            item.status = RequestStatus.INTERRUPTED if item.ttft_ms is not None else RequestStatus.FAILED
            item.error_kind = "gateway_died"
            finals[request_id] = item
    return list(finals.values())


def set_aside(directory: Path, items: list[Finished]) -> None:
    """Records the database refused (B11): written as a segment of their own
    that no process holds, so ``replay_dead`` offers them to the database
    again each time it runs (once what refused them is mended, they land),
    and they are never dropped. The segments they came from can go."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"refused-{secrets.token_hex(8)}{SUFFIX}"
    temporary = path.with_suffix(".partial")  # never read half-written: renamed once whole
    temporary.write_bytes(b"".join(FINAL + item.to_json() + b"\n" for item in items))
    temporary.rename(path)


def replay_dead(directory: Path, write: Callable[[list[Finished]], bool]) -> int:
    """Write the records of dead processes' segments to the database and
    delete those segments; returns how many records were written. All dead
    segments are read together, so that a final record in one always beats
    progress in another; if the write fails they all stay for the next try."""
    locked: list[tuple[Path, int]] = []
    try:
        for path in sorted(directory.glob("*" + SUFFIX)) if directory.is_dir() else ():
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # its process lives
                continue
            locked.append((path, fd))
        if not locked:
            return 0
        items = read_segments([path for path, _ in locked])
        if items and not write(items):
            return 0
        for path, _ in locked:
            path.unlink(missing_ok=True)
        if items:
            log.warning("replayed %d request records left by dead gateway processes (%d files)", len(items), len(locked))
        return len(items)
    finally:
        for _, fd in locked:
            os.close(fd)
