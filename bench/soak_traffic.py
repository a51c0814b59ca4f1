"""The soak's traffic: many clients at once, each sending one request after
another to the gateways, in all four client APIs, streaming and not, with
the simulator told (``[sim …]`` in the prompt) to misbehave now and then, and
clients that hang up part-way.

Runs on an asyncio loop of its own (``Traffic.run`` in a thread) until told
to stop; every request is bounded by ``REQUEST_TIMEOUT``. What each request
got back is kept in ``Traffic.outcomes``: the request id the gateway gave it
(``x-hopbase-request-id``), if the client saw one, its status, and how it ended.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx

APIS = ("chat", "responses", "messages", "gemini")
# The model each client API is served through (one per channel protocol).
MODELS = {"chat": "soak-openai", "responses": "soak-openai", "messages": "soak-anthropic", "gemini": "soak-gemini"}
REQUEST_ID_HEADER = "x-hopbase-request-id"
# A hang detector: no request of the mix should take a fraction of this.
REQUEST_TIMEOUT = 30.0
# Scenario weights: (name, weight). See Traffic._scenario for what each one does.
MIX = (
    ("ok_stream", 30),
    ("ok_whole", 14),
    ("cancel_mid_stream", 10),
    ("cancel_early", 5),
    ("stall_stream", 8),
    ("stall_whole", 2),
    ("error_mid_stream", 8),
    ("cut_mid_stream", 8),
    ("fail_before_first_token", 5),
    ("fail_whole", 4),
    ("follow_up", 3),
    ("thinking_stream", 3),
)


@dataclass
class Outcome:
    api: str
    scenario: str
    stream: bool
    gateway: int
    request_id: str | None = None
    status: int | None = None
    # completed (read to the end), hung_up (the client left on purpose),
    # error (a transport error), timeout (REQUEST_TIMEOUT passed)
    ended: str = ""
    connection_close: bool = False
    error_message: str = ""
    took: float = 0.0


@dataclass
class Spec:
    api: str
    scenario: str
    stream: bool
    prompt: str
    hang_up_after_chunks: int | None = None
    hang_up_after_seconds: float | None = None
    previous_response_id: str | None = None


@dataclass
class Traffic:
    gateways: list[str]
    key: str
    concurrency: int
    seed: int
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    _response_ids: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """The thread's body: send until ``stop`` is set, then let what is in
        flight end (each request bounded by REQUEST_TIMEOUT)."""
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported by the soak, never swallowed
            self.failure = error
            raise

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency * 2)
        timeout = httpx.Timeout(REQUEST_TIMEOUT, connect=5.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
            self.started.set()
            await asyncio.gather(*(self._client(client, n) for n in range(self.concurrency)))

    async def _client(self, client: httpx.AsyncClient, number: int) -> None:
        rng = random.Random(f"{self.seed}-{number}")
        sent = 0
        while not self.stop.is_set():
            spec = self._scenario(rng)
            gateway = (number + sent) % len(self.gateways)
            sent += 1
            self.outcomes.append(await self._send(client, gateway, spec))
            await asyncio.sleep(rng.uniform(0, 0.05))  # pacing

    # ------------------------------------------------------------------ the mix

    def _scenario(self, rng: random.Random) -> Spec:
        names, weights = zip(*MIX, strict=True)
        name = rng.choices(names, weights)[0]
        api = rng.choice(APIS)
        words = " ".join(rng.choice(("soak", "load", "words", "prompt", "tokens")) for _ in range(rng.randint(3, 40)))
        tokens = rng.randint(5, 30)
        pace = rng.choice((0.0, 0.005, 0.01, 0.02))
        directives = f"tokens={tokens} pace={pace}"
        stream = True
        spec_extra: dict = {}
        if name == "ok_whole":
            stream = False
        elif name == "cancel_mid_stream":
            directives = "tokens=40 pace=0.02"
            spec_extra["hang_up_after_chunks"] = rng.randint(1, 12)
        elif name == "cancel_early":
            # Hang up during the hold, or before a whole answer is ready.
            stream = rng.random() < 0.6
            directives = f"tokens=20 pace=0.02 first_delay={rng.choice((0.2, 0.5))}"
            spec_extra["hang_up_after_seconds"] = rng.uniform(0.05, 0.6)
        elif name == "stall_stream":
            directives = f"tokens=30 pace=0.01 stall_after={rng.randint(1, 8)}"
        elif name == "stall_whole":
            stream = False
            directives = f"tokens=10 stall_after={rng.randint(1, 8)}"
        elif name == "error_mid_stream":
            kind = rng.choice(("server", "overloaded"))
            directives = f"tokens=30 pace=0.01 error_after={rng.randint(1, 8)} error_kind={kind}"
        elif name == "cut_mid_stream":
            directives = f"tokens=30 pace=0.01 cut_after={rng.randint(1, 8)}"
        elif name == "fail_before_first_token":
            # Every channel fails the same way: failover, then an error in the caller's format.
            directives = rng.choice(("error_after_preamble=overloaded", "status=529", "status=500", "error_after=0"))
            stream = rng.random() < 0.7
        elif name == "fail_whole":
            stream = False
            directives = rng.choice((f"tokens=10 error_after={rng.randint(1, 5)}", f"tokens=10 cut_after={rng.randint(1, 5)}"))
        elif name == "follow_up":
            api = "responses"
            stream = rng.random() < 0.5
            if self._response_ids:
                spec_extra["previous_response_id"] = rng.choice(self._response_ids)
        elif name == "thinking_stream":
            api = rng.choice(("messages", "gemini", "responses"))
            directives = f"tokens={tokens} thinking={rng.randint(1, 10)} pace=0.005"
        prompt = f"{words} [sim {directives}]"
        return Spec(api, name, stream, prompt, **spec_extra)

    # ------------------------------------------------------------------ one request

    def _request(self, spec: Spec) -> tuple[str, dict, dict[str, str]]:
        key, model, stream = self.key, MODELS[spec.api], spec.stream
        if spec.api == "chat":
            body: dict = {"model": model, "stream": stream, "messages": [{"role": "user", "content": spec.prompt}]}
            if stream:
                body["stream_options"] = {"include_usage": True}
            return "/v1/chat/completions", body, {"authorization": f"Bearer {key}"}
        if spec.api == "responses":
            body = {"model": model, "stream": stream, "input": spec.prompt}
            if spec.previous_response_id:
                body["previous_response_id"] = spec.previous_response_id
            return "/v1/responses", body, {"authorization": f"Bearer {key}"}
        if spec.api == "messages":
            body = {"model": model, "max_tokens": 512, "stream": stream,
                    "messages": [{"role": "user", "content": spec.prompt}]}
            return "/v1/messages", body, {"x-api-key": key, "anthropic-version": "2023-06-01"}
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": spec.prompt}]}]}
        return f"/v1beta/models/{model}:{action}", body, {"x-goog-api-key": key}

    async def _send(self, client: httpx.AsyncClient, gateway: int, spec: Spec) -> Outcome:
        path, body, headers = self._request(spec)
        outcome = Outcome(spec.api, spec.scenario, spec.stream, gateway)
        started = time.monotonic()
        exchange = self._exchange(client, self.gateways[gateway] + path, body, headers, spec, outcome)
        try:
            if spec.hang_up_after_seconds is not None:
                try:
                    await asyncio.wait_for(exchange, spec.hang_up_after_seconds)
                except TimeoutError:
                    outcome.ended = "hung_up"  # the client left; closing the connection tells the gateway
            else:
                await asyncio.wait_for(exchange, REQUEST_TIMEOUT)
        except TimeoutError:
            outcome.ended = "timeout"
        except httpx.HTTPError as error:
            outcome.ended = "error"
            outcome.error_message = f"{type(error).__name__}: {error}"
        outcome.took = time.monotonic() - started
        return outcome

    async def _exchange(self, client: httpx.AsyncClient, url: str, body: dict, headers: dict[str, str],
                        spec: Spec, outcome: Outcome) -> None:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            outcome.status = response.status_code
            outcome.request_id = response.headers.get(REQUEST_ID_HEADER)
            outcome.connection_close = response.headers.get("connection", "").lower() == "close"
            if spec.hang_up_after_chunks is not None and response.status_code == 200:
                chunks = 0
                async for _ in response.aiter_raw():
                    chunks += 1
                    if chunks >= spec.hang_up_after_chunks:
                        outcome.ended = "hung_up"  # leaving the block closes the connection unread
                        return
                outcome.ended = "completed"
                return
            data = await response.aread()
            outcome.ended = "completed"
            if response.status_code != 200:
                outcome.error_message = _error_message(data)
            elif spec.api == "responses" and not spec.stream:
                try:
                    self._response_ids.append(json.loads(data)["id"])
                except (ValueError, KeyError, TypeError):
                    pass


def _error_message(data: bytes) -> str:
    try:
        error = json.loads(data).get("error") or {}
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")
    return str(error.get("message", ""))[:200] if isinstance(error, dict) else str(error)[:200]
