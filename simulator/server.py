"""The simulator's server: routes requests, keeps the records and drives each answer.

Each request is routed by path to its protocol (the clouds' routes by
``clouds``), its directives are read (``requests``), a ``Record`` is kept of
it (``records``), and its answer is rendered (``wire``) and sent over the
hand-written HTTP layer (``http``), with the pacing, splitting and failures
at token N the directives ask for.

``python manage.py simulate_upstream`` runs it as a process (``run``); tests
can also ``await Simulator().start(host, 0)`` inside their own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from simulator import embeddings, wire
from simulator.cloud_auth import TokenIssuer
from simulator.clouds import CloudEndpoints, cloud_call
from simulator.http import BadRequest, BodyWriter, ClientGone, Connection, Request, read_request
from simulator.records import Record
from simulator.requests import Directives, api_key_of, build_script, gather_directives, prompt_texts
from simulator.side_endpoints import GEMINI_MODELS, SideEndpoints

_GEMINI_CALL = re.compile(r"/(v1|v1beta|v1alpha)/(.+):(generateContent|streamGenerateContent)")
_GEMINI_CACHES = re.compile(r"/(v1|v1beta|v1alpha)/cachedContents")
_GEMINI_COUNT = re.compile(r"/(v1|v1beta|v1alpha)/models/(.+):countTokens")
_GEMINI_EMBED = re.compile(r"/(v1|v1beta|v1alpha)/models/(.+):(embedContent|batchEmbedContents)")

ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic",
}


# --------------------------------------------------------------------------- the server


# OpenAI's answer to Chat Completions for a model it serves on Responses alone.
RESPONSES_ONLY = "This model is only supported in v1/responses and not in v1/chat/completions."


class Simulator(SideEndpoints, CloudEndpoints):
    """The fake provider. ``await start(host, port)`` returns the bound port (0 picks one)."""

    def __init__(self) -> None:
        self.tokens = TokenIssuer()  # Vertex's token endpoint (``vertex_token_ttl`` sets their lifetime)
        self._records: list[Record] = []
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._gates: dict[str, asyncio.Event] = {}  # tag -> released (gate_at)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [record.as_dict() for record in self._records]

    def clear(self) -> None:
        self._records.clear()

    async def start(self, host: str = "127.0.0.1", port: int = 8901) -> int:
        # A gateway opening thousands of streams at once (bench/run.py
        # --open-streams) connects faster than asyncio's default backlog of 100.
        self._server = await asyncio.start_server(self._serve, host, port, backlog=4096)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Every event must leave at once; Nagle would glue chunks together.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(reader, writer)
        try:
            while not conn.gone.is_set():
                request = await read_request(conn)
                if request is None or not await self._dispatch(conn, request):
                    break
        except BadRequest as exc:
            with contextlib.suppress(ClientGone):
                body = json.dumps({"error": {"message": f"simulated bad request: {exc}"}}).encode()
                await conn.send_head(400, {"content-type": "application/json", "content-length": str(len(body)),
                                           "connection": "close"})
                await conn.write(body)
        except (ClientGone, OSError):
            pass
        except asyncio.CancelledError:
            # stop() cancels connections; ending quietly keeps Python 3.11's
            # start_server callback from logging the cancellation as an error.
            pass
        finally:
            await conn.unwatch()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _dispatch(self, conn: Connection, request: Request) -> bool:
        """Answer one request; False closes the connection."""
        path, method = request.path, request.method
        if path == "/_sim/health":
            return await self._json(conn, request, 200, {"status": "ok"})
        if path == "/_sim/records":
            if method == "DELETE":
                count = len(self._records)
                self.clear()
                return await self._json(conn, request, 200, {"deleted": count})
            tag = request.query.get("tag")
            return await self._json(conn, request, 200,
                                    [r.as_dict() for r in self._records if tag is None or r.tag == tag])
        if path == "/_sim/release" and method == "POST":
            # Lets a gate_at stream go on; a release that comes first is kept.
            self._gate(request.query.get("tag", "")).set()
            return await self._json(conn, request, 200, {"released": request.query.get("tag", "")})
        if path == "/_sim/tokens":
            return await self._token_control(conn, request)

        record = Record(id=next(self._ids), method=method, path=path, query=request.query,
                        headers=request.headers, peer=conn.peer, started_at=time.time())
        self._records.append(record)
        try:
            return await self._answer(conn, request, record)
        finally:
            record.finished_at = time.time()

    async def _answer(self, conn: Connection, request: Request, record: Record) -> bool:
        path, method = request.path, request.method
        if method == "POST" and path == "/token":
            return await self._token(conn, request, record)
        cloud = cloud_call(path) if method == "POST" else None
        if cloud is not None:
            return await self._cloud(conn, request, record, cloud)
        protocol = ROUTES.get(path)
        stream = False
        model: str | None = None
        gemini = _GEMINI_CALL.fullmatch(path)
        if gemini:
            protocol = "gemini"
            model = gemini.group(2).removeprefix("models/")
            stream = gemini.group(3) == "streamGenerateContent"
        if method == "GET" and (path == "/v1/models" or GEMINI_MODELS.fullmatch(path)):
            return await self._models(conn, request, record)
        if method == "POST" and _GEMINI_CACHES.fullmatch(path):
            return await self._cache(conn, request, record)
        if method == "POST" and path == "/v1/embeddings":
            return await self._embed(conn, request, record, "chat", embeddings.AZURE, None)
        embed = _GEMINI_EMBED.fullmatch(path) if method == "POST" else None
        if embed:
            kind = embeddings.GEMINI if embed.group(3) == "embedContent" else embeddings.GEMINI_BATCH
            return await self._embed(conn, request, record, "gemini", kind, embed.group(2))
        counted = _GEMINI_COUNT.fullmatch(path)
        if method == "POST" and (counted or path == "/v1/messages/count_tokens"):
            return await self._count(conn, request, record, counted.group(2) if counted else None)
        if protocol is None or method != "POST":
            missing = {"error": {"message": f"simulated upstream has no route for {method} {path}",
                                 "type": "not_found", "code": 404}}
            return await self._json(conn, request, 404, missing, record)

        record.protocol = protocol
        api_key = api_key_of(request.headers, request.query)
        parsed = request.parsed_body()
        record.body = parsed
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        texts = prompt_texts(protocol, body)
        raw = gather_directives(api_key, texts, request.headers.get("x-sim"))
        directives = Directives.from_raw(raw)
        record.directives = raw
        record.tag = directives.tag
        if protocol != "gemini":
            model = body.get("model") if isinstance(body.get("model"), str) else None
            stream = body.get("stream") is True
        record.model = model
        record.stream = stream

        if directives.status is not None:
            headers = {"retry-after": directives.retry_after} if directives.retry_after else {}
            failure = wire.error_body(protocol, directives.status, directives.reason)
            return await self._json(conn, request, directives.status, failure, record, headers)
        if directives.responses_only and protocol == "chat":
            return await self._json(conn, request, 400, wire.error_body(protocol, 400, message=RESPONSES_ONLY), record)
        if not isinstance(parsed, dict):
            failure = wire.error_body(protocol, 400, message="simulated upstream: the body is not a JSON object")
            return await self._json(conn, request, 400, failure, record)

        renderer = wire.RENDERERS[protocol](build_script(protocol, model, body, texts, directives, request))
        return await self._deliver(conn, request, record, renderer, directives, stream)

    async def _embed(self, conn: Connection, request: Request, record: Record, protocol: str, kind: str,
                     model: str | None) -> bool:
        """OpenAI's ``/v1/embeddings`` and Gemini's ``:embedContent`` / ``:batchEmbedContents``
        (the clouds' embeddings: ``clouds``); only the wait before the answer of the timing directives."""
        record.protocol = f"{protocol}-embeddings"
        parsed = request.parsed_body()
        record.body = parsed
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        texts = embeddings.embedding_texts(kind, body)
        raw = gather_directives(api_key_of(request.headers, request.query), texts, request.headers.get("x-sim"))
        d = Directives.from_raw(raw)
        model = model or (body.get("model") if isinstance(body.get("model"), str) else None)
        record.directives, record.tag, record.model = raw, d.tag, model
        if d.status is not None:
            headers = {"retry-after": d.retry_after} if d.retry_after else {}
            return await self._json(conn, request, d.status, wire.error_body(protocol, d.status, d.reason), record,
                                    headers)
        problem = "simulated upstream: nothing to embed" if not texts else embeddings.too_many(kind, model or "", texts)
        if problem:
            return await self._json(conn, request, 400, wire.error_body(protocol, 400, message=problem), record)
        await conn.sleep(d.first_delay)
        record.completed = True
        answer = embeddings.embedding_body(kind, body, texts, model or "sim-embedding")
        return await self._json(conn, request, 200, answer, record)

    async def _deliver(self, conn: Connection, request: Request, record: Record, renderer: wire.Renderer,
                       d: Directives, stream: bool) -> bool:
        """Send a rendered answer, streamed or whole, noticing at once if the caller hangs up."""
        conn.watch(record.note_hang_up)
        try:
            if stream:
                return await self._stream(conn, request, record, renderer, d)
            return await self._whole(conn, request, record, renderer, d)
        finally:
            await conn.unwatch()

    def _headers(self, record: Record | None, content_type: str, request_id_header: str | None) -> dict[str, str]:
        headers = {"content-type": content_type, "server": "hopbase-simulator"}
        if record is not None:
            headers["x-sim-record"] = str(record.id)
        if request_id_header:
            headers[request_id_header] = f"req_{secrets.token_hex(12)}"
        return headers

    async def _json(self, conn: Connection, request: Request, status: int, payload: object,
                    record: Record | None = None, extra: dict[str, str] | None = None) -> bool:
        body = wire.dump(payload).encode()
        renderer = wire.RENDERERS.get(record.protocol) if record and record.protocol else None
        request_id = renderer.request_id_header if renderer else None
        headers = self._headers(record, "application/json", request_id)
        headers.update(extra or {})
        headers["content-length"] = str(len(body))
        if not request.keep_alive:
            headers["connection"] = "close"
        await conn.send_head(status, headers)
        await conn.write(body)
        if record is not None:
            record.status = status
            record.sent += body
        return request.keep_alive

    async def _whole(self, conn: Connection, request: Request, record: Record,
                     renderer: wire.Renderer, d: Directives) -> bool:
        """A non-streaming answer: nothing is sent until the whole answer exists, so any
        failure ordered for token N becomes an HTTP error, a silence or a dropped socket."""
        total = renderer.script.output_tokens
        failures: list[tuple[int, str, str]] = []
        if d.error_after_preamble:
            failures.append((0, "error", d.error_after_preamble))
        if d.error_after is not None and d.error_after <= total:
            failures.append((d.error_after, "error", d.error_kind))
        if d.stall_after is not None and d.stall_after <= total:
            failures.append((d.stall_after, "stall", ""))
        if d.cut_after is not None and d.cut_after <= total:
            failures.append((d.cut_after, "cut", ""))
        if failures:
            at, what, kind = min(failures, key=lambda failure: failure[0])
            await conn.sleep(d.generation_time(at))
            if what == "stall":
                await conn.wait_for_hang_up()
            if what == "cut":
                return False
            status = renderer.error_status(kind)
            return await self._json(conn, request, status, renderer.error_body(status), record,
                                    renderer.error_headers(status))

        await conn.sleep(d.generation_time(total))
        body = wire.dump(renderer.body()).encode()
        headers = self._headers(record, renderer.json_content_type, renderer.request_id_header)
        headers.update(renderer.headers(stream=False))
        headers["content-length"] = str(len(body))
        if not request.keep_alive:
            headers["connection"] = "close"
        record.status = 200
        await conn.send_head(200, headers)
        out = BodyWriter(conn, record.sent, chunked=False, split=d.split)
        record.first_token_at = time.time()
        await out.event(body, pause=d.pause_mid_event)
        record.tokens_sent = total
        record.completed = True
        return request.keep_alive

    def _gate(self, tag: str) -> asyncio.Event:
        return self._gates.setdefault(tag, asyncio.Event())

    async def _stream(self, conn: Connection, request: Request, record: Record,
                      renderer: wire.Renderer, d: Directives) -> bool:
        headers = self._headers(record, renderer.stream_content_type, renderer.request_id_header)
        headers.update(renderer.headers(stream=True))
        headers.update({"cache-control": "no-cache", "transfer-encoding": "chunked"})
        if not request.keep_alive:
            headers["connection"] = "close"
        record.status = 200
        await conn.send_head(200, headers)
        out = BodyWriter(conn, record.sent, chunked=True, split=d.split)
        tokens = written = 0
        in_preamble = True

        async def fail(kind: str) -> bool:
            await out.event(renderer.stream_error(kind, written))
            await out.flush()
            await conn.write(b"0\r\n\r\n")
            return request.keep_alive

        for event in renderer.events():
            if event.kind != wire.PREAMBLE:
                if in_preamble and d.error_after_preamble:
                    return await fail(d.error_after_preamble)
                in_preamble = False
                # Each failure fires before the first event that follows its Nth token.
                if d.error_after == tokens:
                    return await fail(d.error_kind)
                if d.stall_after == tokens:
                    await out.flush()
                    await conn.wait_for_hang_up()
                if d.cut_after == tokens:
                    await out.flush()
                    return False  # closing now leaves the chunked body unterminated
            pause = 0.0
            if event.kind == wire.TOKEN and d.gate_at == tokens and d.tag:
                await out.flush()
                released = asyncio.ensure_future(self._gate(d.tag).wait())
                hung_up = asyncio.ensure_future(conn.gone.wait())
                await asyncio.wait((released, hung_up), return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
                hung_up.cancel()
                self._gates.pop(d.tag, None)
                if conn.gone.is_set():
                    raise ClientGone
                record.released_at = time.time()
            if event.kind == wire.TOKEN:
                delay = d.first_delay if tokens == 0 else d.pace
                if delay > 0:
                    await out.flush()
                    await conn.sleep(delay)
                pause = d.pause_mid_event if tokens == d.pause_at else 0.0
                if tokens == 0:
                    # Stamped before the write: a gateway on the same machine can relay
                    # the token before this coroutine resumes from writing it.
                    record.first_token_at = time.time()
            await out.event(event.data, pause=pause, may_hold=True)
            written += 1
            if event.kind == wire.TOKEN:
                tokens += 1
                record.tokens_sent = tokens
        await out.flush()
        record.completed = True
        await conn.write(b"0\r\n\r\n")
        return request.keep_alive


def run(host: str = "127.0.0.1", port: int = 8901, ready: Callable[[str, int], None] | None = None,
        vertex_token_ttl: float | None = None) -> None:
    """Serve until the process is killed; ``ready(host, port)`` is called once listening."""

    async def serve() -> None:
        simulator = Simulator()
        if vertex_token_ttl is not None:
            simulator.vertex_token_ttl = vertex_token_ttl
        bound = await simulator.start(host, port)
        if ready is not None:
            ready(host, bound)
        try:
            await asyncio.Event().wait()
        finally:
            await simulator.stop()

    asyncio.run(serve())
