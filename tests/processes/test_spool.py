"""The request spool (D2): every record on disk before the client's last
bytes, segments deleted once their records are in the database, and a dead
process's files turned into rows — its streams in flight as interrupted
requests billed for their last progress."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.finished import Finished
from billing.spool import Spool, read_segment, replay_dead
from core.usage import Usage
from core.vocabulary import ApiName, RequestStatus


def record(request_id: str, status=RequestStatus.COMPLETED, output: int = 3, ttft_ms: int | None = 40) -> Finished:
    return Finished(
        request_id=request_id,
        created_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
        tenant_id=1,
        api_key_id=2,
        protocol=ApiName.MESSAGES,
        status=status,
        model="claude-test",
        stream=True,
        channel_id=3,
        usage=Usage(input_tokens=10, output_tokens=output, input_reported=True, output_reported=True),
        sent_chars=12,
        ttft_ms=ttft_ms,
        price_multiplier=Decimal("0.8"),
    )


def files(directory) -> list[str]:
    return sorted(p.name for p in directory.glob("*.spool"))


def test_a_record_survives_its_trip_to_disk_and_back(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    original = record("req_a")
    spool.final(original)
    (path,) = tmp_path.glob("*.spool")
    assert read_segment(path) == [original]


def test_records_written_in_pieces_are_read_back_whole(tmp_path, monkeypatch):
    # os.write may take part of a line (a signal, a nearly full disk).
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
    spool = Spool(tmp_path, max_bytes=1 << 20)
    originals = [record("req_a"), record("req_b", status=RequestStatus.INTERRUPTED)]
    for original in originals:
        spool.final(original)
    (path,) = tmp_path.glob("*.spool")
    assert read_segment(path) == originals


def test_a_record_the_disk_could_not_take_whole_leaves_nothing_for_the_next_to_start_on(tmp_path, monkeypatch):
    real_write = os.write
    calls = []

    def filling_up(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:7])  # part of the line, then the disk is full
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)  # room again

    monkeypatch.setattr(os, "write", filling_up)
    spool = Spool(tmp_path, max_bytes=1 << 20)
    with pytest.raises(OSError):
        spool.final(record("req_a"))
    spool.final(record("req_b"))
    (path,) = tmp_path.glob("*.spool")
    assert [item.request_id for item in read_segment(path)] == ["req_b"]
    assert spool.size == path.stat().st_size


def test_a_segment_is_deleted_once_its_records_are_in_the_database(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1)  # every write closes the segment
    spool.final(record("req_a"))
    spool.final(record("req_b"))
    assert len(files(tmp_path)) == 3  # two closed, one open and empty
    spool.committed(["req_a"])
    assert len(files(tmp_path)) == 2
    spool.committed(["req_b"])
    assert len(files(tmp_path)) == 1
    assert spool.size == 0


def test_a_stream_in_flight_is_journalled_again_in_each_new_segment(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=600)
    progress = {"output": 1}
    spool.track("req_live", lambda: record("req_live", RequestStatus.INTERRUPTED, output=progress["output"]))
    progress["output"] = 7
    for n in range(6):
        spool.final(record(f"req_{n}"))
    spool.committed([f"req_{n}" for n in range(6)])
    remaining = [item for path in tmp_path.glob("*.spool") for item in read_segment(path)]
    assert [(item.request_id, item.usage.output_tokens) for item in remaining] == [("req_live", 7)]


def test_a_dead_process_leaves_finals_and_its_streams_as_interrupted(tmp_path):
    path = tmp_path / "123-dead-1.spool"
    done = record("req_done")
    path.write_bytes(
        b"P" + record("req_done", RequestStatus.INTERRUPTED, output=1).to_json() + b"\n"
        + b"F" + done.to_json() + b"\n"
        + b"P" + record("req_cut", RequestStatus.INTERRUPTED, output=2).to_json() + b"\n"
        + b"P" + record("req_cut", RequestStatus.INTERRUPTED, output=5).to_json() + b"\n"
        + b"P" + record("req_mute", RequestStatus.INTERRUPTED, output=0, ttft_ms=None).to_json() + b"\n"
        + b'F{"request_id": "req_torn", "crea'  # the process died mid-write
    )
    found = {item.request_id: item for item in read_segment(path)}
    assert set(found) == {"req_done", "req_cut", "req_mute"}
    assert found["req_done"] == done
    assert (found["req_cut"].status, found["req_cut"].usage.output_tokens) == (RequestStatus.INTERRUPTED, 5)
    assert found["req_cut"].error_kind == "gateway_died"
    assert found["req_mute"].status is RequestStatus.FAILED  # never delivered: free (B5)


def test_replay_writes_dead_files_and_leaves_live_ones(tmp_path):
    live = Spool(tmp_path, max_bytes=1 << 20)
    live.final(record("req_live"))
    (tmp_path / "999-dead-1.spool").write_bytes(b"F" + record("req_dead").to_json() + b"\n")
    written: list[list[Finished]] = []
    assert replay_dead(tmp_path, lambda items: written.append(items) or True) == 1
    assert [[item.request_id for item in batch] for batch in written] == [["req_dead"]]
    assert len(files(tmp_path)) == 1  # the live process's file stays


def test_a_file_the_database_cannot_take_yet_stays_for_the_next_replay(tmp_path):
    (tmp_path / "999-dead-1.spool").write_bytes(b"F" + record("req_dead").to_json() + b"\n")
    assert replay_dead(tmp_path, lambda items: False) == 0
    assert files(tmp_path) == ["999-dead-1.spool"]
    assert replay_dead(tmp_path, lambda items: True) == 1
    assert files(tmp_path) == []


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_file_locked_by_another_live_process_is_not_replayed(tmp_path):
    path = tmp_path / "999-other-1.spool"
    path.write_bytes(b"F" + record("req_other").to_json() + b"\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"locked\n"
        assert replay_dead(tmp_path, lambda items: True) == 0
        assert files(tmp_path) == [path.name]
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert replay_dead(tmp_path, lambda items: True) == 1


def test_the_spool_says_when_it_is_full(tmp_path):
    spool = Spool(tmp_path, max_bytes=2000)
    while not spool.full:
        spool.final(record(f"req_{spool.size}"))
    assert spool.size >= 2000
    spool.committed([])
    assert spool.full  # nothing committed: still full


def test_a_final_in_one_dead_segment_beats_progress_in_another_whatever_their_order(tmp_path):
    """A stream journalled in an older segment and finished in a newer one
    is replayed as it ended, not as interrupted (whichever file sorts first)."""
    done = record("req_x", output=500)
    (tmp_path / "1-aaaa-1.spool").write_bytes(b"P" + record("req_x", RequestStatus.INTERRUPTED, output=10).to_json() + b"\n")
    (tmp_path / "1-0000-2.spool").write_bytes(b"F" + done.to_json() + b"\n")
    written: list[Finished] = []
    assert replay_dead(tmp_path, lambda items: written.extend(items) or True) == 1
    assert written == [done]
    assert files(tmp_path) == []


def test_a_new_segment_is_never_seen_unlocked(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1)
    for n in range(5):
        spool.final(record(f"req_{n}"))
        assert replay_dead(tmp_path, lambda items: True) == 0  # every segment is its living process's
    assert not list(tmp_path.glob("*.creating"))


def test_a_forked_child_journals_in_segments_of_its_own(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.final(record("req_parent"))
    child = os.fork()
    if child == 0:  # the child: exit at once, with what it found as its status
        try:
            spool.final(record("req_child"))
            mine = [p for p in tmp_path.glob("*.spool") if p.name.startswith(f"{os.getpid()}-")]
            os._exit(0 if [r.request_id for p in mine for r in read_segment(p)] == ["req_child"] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ours = [p for p in tmp_path.glob("*.spool") if p.name.startswith(f"{os.getpid()}-")]
    assert [r.request_id for p in ours for r in read_segment(p)] == ["req_parent"]
