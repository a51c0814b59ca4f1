"""The upstream simulator served in-process for its own tests, with SDK clients pointed at it.

Shared by ``test_simulator_wire`` and ``test_simulator_server``; each of them
starts one simulator per module with ``serving()``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
from google import genai
from google.genai import types as genai_types

from simulator import Simulator
from simulator.wire import TEXT_WORDS

PROMPT = "Please describe the weather in Paris today"  # 7 words, 42 characters


def expected_text(count: int, words: tuple[str, ...] = TEXT_WORDS) -> str:
    return " ".join(words[i % len(words)] for i in range(count))


def words_in(*texts: str) -> int:
    return sum(len(text.split()) for text in texts)


@dataclass
class Sim:
    base: str
    port: int
    simulator: Simulator
    http: httpx.Client
    # Building an SDK client costs tens of milliseconds (TLS contexts), and genai
    # closes its HTTP client once the Client object is collected, even mid-call
    # through client.models: so clients are built once and kept for the module.
    clients: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def records(self, tag: str | None = None) -> list[dict[str, Any]]:
        params = {"tag": tag} if tag else {}
        return self.http.get(f"{self.base}/_sim/records", params=params).json()

    def record(self, tag: str) -> dict[str, Any]:
        found = self.records(tag)
        assert len(found) == 1, found
        return found[0]

    def wait_record(self, tag: str, ready: Callable[[dict[str, Any]], bool], within: float = 2.0) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            record = self.record(tag)
            if ready(record) or time.monotonic() > deadline:
                return record
            threading.Event().wait(0.005)

    def sent(self, tag: str) -> bytes:
        return base64.b64decode(self.record(tag)["sent_b64"])

    def _client(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        if key not in self.clients:
            self.clients[key] = build()
        return self.clients[key]

    def openai(self, api_key: str = "x") -> openai.OpenAI:
        return self._client(("openai", api_key), lambda: openai.OpenAI(
            base_url=f"{self.base}/v1", api_key=api_key, max_retries=0))

    def anthropic(self, api_key: str = "x") -> anthropic.Anthropic:
        return self._client(("anthropic", api_key), lambda: anthropic.Anthropic(
            base_url=self.base, api_key=api_key, max_retries=0))

    def gemini(self, api_key: str = "x", version: str = "v1beta",
               headers: dict[str, str] | None = None) -> genai.Client:
        options = genai_types.HttpOptions(base_url=self.base, api_version=version, headers=headers)
        key = ("gemini", api_key, version, tuple(sorted((headers or {}).items())))
        return self._client(key, lambda: genai.Client(api_key=api_key, http_options=options))


@contextlib.contextmanager
def serving() -> Iterator[Sim]:
    """A simulator on a free port, on an event loop in a thread of its own, until the block ends."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    simulator = Simulator()
    port = asyncio.run_coroutine_threadsafe(simulator.start("127.0.0.1", 0), loop).result(timeout=5)
    server = Sim(f"http://127.0.0.1:{port}", port, simulator, httpx.Client())
    deadline = time.monotonic() + 5
    while True:
        try:
            if server.http.get(f"{server.base}/_sim/health").status_code == 200:
                break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
    try:
        yield server
    finally:
        server.http.close()
        asyncio.run_coroutine_threadsafe(simulator.stop(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def sse_blocks(raw: bytes) -> list[str]:
    return [block for block in raw.decode().replace("\r\n", "\n").split("\n\n") if block]
