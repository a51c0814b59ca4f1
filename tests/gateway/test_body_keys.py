"""The top-level keys of a body as written (gateway.body_keys): repeats are
found however a key is spelt or spaced, and nothing else is taken for one."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from gateway.body_keys import repeated_key, top_level_keys


def keys_as_json_reads_them(raw: bytes) -> list[str]:
    """The reference: Python's json with a hook that sees every pair; its
    last call is the top-level object."""
    seen: list[list[str]] = []

    def pairs_hook(pairs):
        seen.append([key for key, _ in pairs])
        return dict(pairs)

    json.loads(raw, object_pairs_hook=pairs_hook)
    return seen[-1]


@pytest.mark.parametrize(
    ("raw", "repeated"),
    [
        (b'{"model": "cheap", "stream": true, "model": "dear"}', "model"),
        (b'{"model":"cheap","mod\\u0065l":"dear"}', "model"),  # an escaped spelling is the same key
        (b'{\n  "model" : "a",\n  "x": {"model": "nested is fine"},\n  "model"\t:\r\n"b"\n}', "model"),
        ('{"é": 1, "\\u00e9": 2}'.encode(), "é"),
        (b'{"a\\\\": 1, "a\\\\": 2}', "a\\"),
        (b'{"model": "m", "messages": [{"model": "x", "model": "y"}]}', None),  # only the top level
        (b'{"a": "\\"}, \\"a\\": 1", "b": "a\\\\"}', None),  # quotes and braces inside strings
        (b'{"a": [1, {"b": "]}"}], "c": -1.5e3, "d": null, "e": true}', None),
        (b"{}", None),
        (b"[1, 2]", None),
        (b'"text"', None),
    ],
)
def test_it_finds_a_repeated_top_level_key(raw, repeated):
    assert repeated_key(raw, orjson.loads(raw)) == repeated


def test_it_reads_the_keys_as_written_in_order():
    raw = '  {"model": "m", "messages": [{"role": "user", "content": "日本語 \\"q\\" }"}], "stream": false}  '.encode()
    assert top_level_keys(raw) == ["model", "messages", "stream"]


def test_it_agrees_with_a_full_parse_on_random_bodies():
    rng = random.Random(10)
    strings = ["x", 'a"b\\', "é\\\"", "", "}", '{"a":1}', "\\\\", "[", "日本"]

    def value(depth: int = 0):
        choice = rng.random()
        if depth > 3 or choice < 0.35:
            return rng.choice([1, -2.5e3, True, False, None, *strings])
        if choice < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["a", "b", '"', "\\", "é"]): value(depth + 1) for _ in range(rng.randint(0, 3))}

    for _ in range(2000):
        members = []
        for _ in range(rng.randint(0, 5)):
            key = rng.choice(["model", "stream", "a\\", "é", '"q', "x y"])
            spelt = json.dumps(key, ensure_ascii=rng.random() < 0.5)
            if key == "model" and rng.random() < 0.3:
                spelt = '"mod\\u0065l"'
            encoded = json.dumps(value(), ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
            members.append(spelt + rng.choice([":", " : ", ":\n  "]) + encoded)
        joined = rng.choice([",", " ,\n"]).join(members)
        raw = (rng.choice(["", " ", "\n"]) + "{" + joined + rng.choice(["}", " }"])).encode()
        expected = keys_as_json_reads_them(raw)
        assert top_level_keys(raw) == expected, raw
        assert (repeated_key(raw, orjson.loads(raw)) is not None) == (len(set(expected)) < len(expected)), raw
