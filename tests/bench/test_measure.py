"""The benchmark's raw-socket reader (bench/measure.py) reads answers whole
and exactly: its latency rows are only as good as its idea of an answer's
last byte."""

import base64
import secrets

from bench.measure import RawCall, RawConnection, chat_body, raw_latencies

HEADERS = {"authorization": "Bearer sk-simulated", "content-type": "application/json"}


def test_a_chunked_stream_is_read_to_its_last_chunk_with_every_byte(simulator, sim_records):
    tag = secrets.token_hex(4)
    connection = RawConnection(simulator.url)
    try:
        # split= cuts events into several chunks, some inside a character or a CRLF.
        body = chat_body(f"Tell a story. [sim tag={tag} tokens=30 split=7] ☃", stream=True)
        elapsed, status, answer = connection.post("/v1/chat/completions", HEADERS, body)
    finally:
        connection.close()
    (record,) = sim_records(tag)
    assert status == 200
    assert elapsed > 0
    assert answer == base64.b64decode(record["sent_b64"])
    assert answer.endswith(b"data: [DONE]\n\n")


def test_answers_follow_one_another_on_one_connection(simulator):
    connection = RawConnection(simulator.url)
    try:
        answers = [connection.post("/v1/chat/completions", HEADERS, chat_body(f"Hi. [sim tokens={n}]", stream=stream))
                   for n, stream in ((3, False), (5, True), (4, False))]
    finally:
        connection.close()
    assert [status for _, status, _ in answers] == [200, 200, 200]
    whole, stream, last = (answer for _, _, answer in answers)
    assert whole.startswith(b"{") and whole.endswith(b"}")
    assert stream.startswith(b"data: ") and stream.endswith(b"data: [DONE]\n\n")
    assert last.startswith(b"{") and b'"completion_tokens":4' in last
    assert connection.buffer == b""


def test_raw_latencies_count_only_complete_answers(simulator):
    calls = [
        RawCall("whole", simulator.url, HEADERS, chat_body("Hi. [sim tokens=2]", stream=False), b'"choices"'),
        RawCall("refused", simulator.url, HEADERS, chat_body("Hi. [sim status=503]", stream=False), b'"choices"'),
    ]
    results = raw_latencies(calls, 3)
    assert len(results["whole"].latency) == 3 and not results["whole"].errors
    assert results["refused"].latency == [] and results["refused"].errors == {"HTTP 503": 3}
