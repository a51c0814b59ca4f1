"""The SSE splitter hands back whole events as their exact bytes, however
the stream was cut into chunks."""

from __future__ import annotations

import random
import re

import orjson
import pytest

from core.sse import Event, EventSplitter

STREAMS = {
    "lf": b'event: a\ndata: {"x":"h\xc3\xa9llo"}\n\ndata: [DONE]\n\n',
    "crlf": b'data: {"candidates":[]}\r\n\r\ndata: {"x":"\xe6\x97\xa5"}\r\n\r\n',
    "cr": b"data: one\r\rdata: two\r\r",
    "comments and blank runs": b": ping\n\ndata: a\n\n\n\ndata: b\n\n",
    "long lines": b"data: " + b"a" * 3000 + b"\r\ndata: " + b"b" * 3000 + b"\r\n\r\ndata: c\r\r",
}


def split_everywhere(stream: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), k=min(len(stream) - 1, 12)))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]


@pytest.mark.parametrize("name", STREAMS)
@pytest.mark.parametrize("seed", range(20))
def test_it_returns_every_byte_in_whole_events_whatever_the_chunking(name: str, seed: int) -> None:
    stream = STREAMS[name]
    splitter = EventSplitter()
    events = [event for chunk in split_everywhere(stream, seed) for event in splitter.feed(chunk)]
    events += splitter.finish()
    assert b"".join(e.raw for e in events) == stream
    whole = EventSplitter()
    assert [e.raw for e in events] == [e.raw for e in whole.feed(stream) + whole.finish()]


def test_it_waits_for_the_byte_after_a_trailing_carriage_return() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b"data: x\r\n\r") == []
    (event,) = splitter.feed(b"\n")
    assert event.raw == b"data: x\r\n\r\n"


def test_it_parses_fields_and_json() -> None:
    (event,) = EventSplitter().feed(b'event: message_start\ndata: {"type":"message_start"}\n\n')
    assert event.name == "message_start"
    assert event.json == {"type": "message_start"}


def test_multi_line_data_is_joined_with_newlines() -> None:
    (event,) = EventSplitter().feed(b"data: [1,\ndata: 2]\n\n")
    assert event.data == "[1,\n2]"
    assert event.json == [1, 2]


def test_an_unfinished_event_stays_pending_until_the_stream_ends() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b'data: {"a"') == []
    assert splitter.pending == b'data: {"a"'
    (event,) = splitter.finish()
    assert event.raw == b'data: {"a"'
    assert splitter.pending == b""


def test_it_keeps_a_line_separator_inside_json_data():
    # U+2028 is a line break to str.splitlines(), not to SSE: the event's
    # JSON must still parse, with the character in it.
    event = Event('data: {"text": "a\u2028b"}\n\n'.encode())
    assert event.json == {"text": "a\u2028b"}
    assert event.data == '{"text": "a\u2028b"}'


def test_it_reads_invalid_utf8_in_json_data_as_replacement_characters():
    event = Event(b'event: x\r\ndata: {"text": "a\xffb"}\r\n\r\n')
    assert event.name == "x"
    assert event.json == {"text": "a\ufffdb"}


@pytest.mark.parametrize("data,parses", [(b"[DONE]", 0), (b"[not json", 1), (b"{broken", 1)])
def test_data_that_is_not_json_reads_as_none_without_a_second_parse(data: bytes, parses: int, monkeypatch) -> None:
    tried = []
    loads = orjson.loads
    monkeypatch.setattr("core.sse.orjson.loads", lambda text: tried.append(text) or loads(text))
    assert Event(b"data: " + data + b"\n\n").json is None
    assert len(tried) == parses  # OpenAI's end marker is not parsed at all


def test_it_joins_several_data_lines_and_skips_comments():
    event = Event(b": note\ndata: {\"a\":\ndata: 1}\n\n")
    assert event.data_bytes == b'{"a":\n1}'
    assert event.json == {"a": 1}
    assert event.name is None


def test_an_event_of_megabytes_in_many_reads_comes_out_whole() -> None:
    # An image answered as one event: read in small pieces, it is held (and
    # counted as held) until its blank line, the last \r\n cut in two.
    event = b"data: " + b"x" * (2 << 20) + b"\r\n\r\n"
    stream = event + b"data: next\r\n\r\n"
    splitter = EventSplitter()
    events: list[Event] = []
    held = []
    for start in range(0, len(event) - 1, 4096):
        events += splitter.feed(stream[start : min(start + 4096, len(event) - 1)])
        held.append(splitter.pending_size)
    assert events == [] and held[-1] == len(event) - 1
    events += splitter.feed(stream[len(event) - 1 :])
    assert [e.raw for e in events] == [event, b"data: next\r\n\r\n"]
    assert all(type(e.raw) is bytes for e in events) and splitter.pending_size == 0


def reference_split(stream: bytes) -> list[bytes]:
    """Events as the SSE rules define them, line by line: a line ends at
    CRLF, LF or CR; an empty line ends the event (or stands alone); what is
    left at the end is a last event."""
    events, start, pos = [], 0, 0
    lines = re.compile(rb"[^\r\n]*(\r\n|\r|\n)")
    while (line := lines.match(stream, pos)) is not None and line.end() > pos:
        if line.end() - line.start() == len(line.group(1)):  # an empty line
            events.append(stream[start:line.end()])
            start = line.end()
        pos = line.end()
    return events + ([stream[start:]] if start < len(stream) else [])


PIECES = [b"data: {\"x\":1}\n", b"\n", b"\n\n", b"event: e\n", b": ping\n", b"data: \xc3\xa9\n", b"data: a", b"\r\n", b"\r"]


@pytest.mark.parametrize("seed", range(200))
def test_any_stream_in_any_chunks_splits_as_the_rules_say(seed: int) -> None:
    rng = random.Random(seed)
    # Half of the streams are LF only, as providers send them; the rest mix in CR.
    pieces = PIECES if seed % 2 else PIECES[:7]
    stream = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
    splitter = EventSplitter()
    chunks = split_everywhere(stream, seed) if len(stream) > 1 else [stream]
    events = [event.raw for chunk in chunks for event in splitter.feed(chunk)]
    events += [event.raw for event in splitter.finish()]
    assert events == reference_split(stream)


@pytest.mark.parametrize("seed", range(100))
def test_a_stream_read_one_event_at_a_time_or_in_short_reads_splits_as_the_rules_say(seed: int) -> None:
    # A provider writing each token as it comes: every read one whole event
    # (the splitter's shortcut), or short reads of up to twelve bytes around them.
    rng = random.Random(seed)
    pieces = PIECES if seed % 2 else PIECES[:7]
    stream = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
    expected = reference_split(stream)
    short, at = [], 0
    while at < len(stream):
        short.append(stream[at : at + rng.randint(1, 12)])
        at += len(short[-1])
    for chunks in (expected, short):
        splitter = EventSplitter()
        events = [event.raw for chunk in chunks for event in splitter.feed(chunk)]
        assert events + [event.raw for event in splitter.finish()] == expected
