"""The clouds' routes: Azure OpenAI, Amazon Bedrock Runtime and Google Vertex AI.

Each cloud's official client works against the simulator as against the
cloud (base URL: the simulator's ``http://127.0.0.1:PORT``; Vertex's
``token_uri`` too), and every directive works on these routes as on the
vendors' own:

- Azure: ``POST /openai/deployments/{deployment}/chat/completions?api-version=…``
  (the deployment is the model), ``/openai/v1/responses`` and
  ``/openai/responses`` (the model in the body), ``/openai/v1/chat/completions``
  and ``/openai/deployments/{deployment}/embeddings``. The key in ``api-key``
  (or ``Authorization: Bearer``); none is 401. ``[sim content_filter=1]``
  refuses the prompt (400 ``content_filter``), ``[sim filter_finish=1]`` ends
  the answer with finish_reason ``content_filter``.
- Bedrock: ``POST /model/{modelId}/converse`` and ``/converse-stream`` for
  any model; ``/invoke`` and ``/invoke-with-response-stream`` for Anthropic
  models (an id containing ``anthropic.``: the Messages body with
  ``anthropic_version: "bedrock-2023-05-31"``, no ``model``, no ``stream``)
  and, ``/invoke`` only, Titan and Cohere embedding models; ``/count-tokens``
  for any model (``{"inputTokens": …}``, the words of the InvokeModel body
  or the Converse messages it is given). Requests are
  SigV4-checked (``cloud_auth``). ``[sim exception_after=N exception=…]`` and
  ``[sim bad_crc_after=N]`` fail a stream at token N; ``status=N`` (with
  ``reason=SomeException`` to name it) fails the request in Bedrock's shape.
- Vertex: ``POST /{v1,v1beta1}/projects/{p}/locations/{l}/publishers/google/models/{m}:generateContent``,
  ``:streamGenerateContent`` (Gemini), ``:countTokens`` and ``:predict``
  (embeddings); ``…/publishers/anthropic/models/{m}:rawPredict`` and
  ``:streamRawPredict`` (the Messages body with ``anthropic_version:
  "vertex-2023-10-16"``, no ``model``). A token from ``POST /token``.

``GET /_sim/tokens`` counts token exchanges (``by_client``: per client_email);
``POST /_sim/tokens?ttl=S`` sets the lifetime of tokens issued from then on,
``POST /_sim/tokens?revoke=1`` makes every issued token unknown.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from simulator import embeddings, wire
from simulator.cloud_auth import (
    DEFAULT_TOKEN_TTL,
    GOOGLE_TOKEN_URI,
    AuthRefused,
    TokenIssuer,
    bedrock_credential,
    email_directives,
)
from simulator.http import Connection, Request
from simulator.records import Record
from simulator.requests import Directives, build_script, count_words, gather_directives, prompt_texts
from simulator.wire.clouds import AzureChatRenderer, content_filter_error
from simulator.wire.converse import BAD_CRC, BedrockRenderer

_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/([^/]+)/(chat/completions|embeddings)")
_AZURE_BY_BODY = {"/openai/v1/responses": "azure-responses", "/openai/responses": "azure-responses",
                  "/openai/v1/chat/completions": "azure-chat"}
_BEDROCK = re.compile(r"/model/(.+)/(invoke|invoke-with-response-stream|converse|converse-stream|count-tokens)")
_VERTEX = re.compile(
    r"/(v1|v1beta1)/projects/[^/]+/locations/[^/]+/publishers/(google|anthropic)/models/([^/:]+):(\w+)")
_VERTEX_OPERATIONS = {"google": ("generateContent", "streamGenerateContent", "countTokens", "predict"),
                      "anthropic": ("rawPredict", "streamRawPredict")}
_ANTHROPIC_VERSIONS = {"bedrock": "bedrock-2023-05-31", "vertex": "vertex-2023-10-16"}


@dataclass(frozen=True)
class CloudCall:
    """What a cloud route asks for. ``protocol`` names the renderer (for an
    embedding call, the one whose error shapes it shares)."""

    cloud: str
    protocol: str
    model: str | None
    stream: bool = False
    embeddings: str | None = None  # the embeddings module's kind
    operation: str = ""


def cloud_call(path: str) -> CloudCall | None:
    """The cloud call a POST to ``path`` is, if it is one."""
    if path in _AZURE_BY_BODY:
        return CloudCall("azure", _AZURE_BY_BODY[path], None)
    if match := _AZURE_DEPLOYMENT.fullmatch(path):
        if match.group(2) == "embeddings":
            return CloudCall("azure", "azure-chat", match.group(1), embeddings=embeddings.AZURE)
        return CloudCall("azure", "azure-chat", match.group(1))
    if match := _BEDROCK.fullmatch(path):
        model, operation = match.groups()
        stream = operation.endswith("stream")
        if operation == "count-tokens":
            grammar = "bedrock-anthropic" if "anthropic." in model else "bedrock-converse"
            return CloudCall("bedrock", grammar, model, operation=operation)
        if operation.startswith("converse"):
            return CloudCall("bedrock", "bedrock-converse", model, stream, operation=operation)
        kind = embeddings.TITAN if "titan-embed" in model else embeddings.COHERE if "cohere.embed" in model else None
        if kind and not stream:
            return CloudCall("bedrock", "bedrock-converse", model, embeddings=kind, operation=operation)
        return CloudCall("bedrock", "bedrock-anthropic", model, stream, operation=operation)
    if match := _VERTEX.fullmatch(path):
        _, publisher, model, operation = match.groups()
        if operation not in _VERTEX_OPERATIONS[publisher]:
            return None
        if publisher == "google":
            stream = operation == "streamGenerateContent"
            kind = embeddings.VERTEX if operation == "predict" else None
            return CloudCall("vertex", "vertex-gemini", model, stream, embeddings=kind, operation=operation)
        return CloudCall("vertex", "vertex-anthropic", model, operation == "streamRawPredict", operation=operation)
    return None


def counted_input(body: dict[str, Any]) -> dict[str, Any]:
    """Bedrock CountTokens' input: an InvokeModel body (a blob: base64 in JSON) or Converse's messages and system."""
    given = body.get("input") if isinstance(body.get("input"), dict) else {}
    invoke = given.get("invokeModel")
    if isinstance(invoke, dict) and isinstance(invoke.get("body"), str):
        with contextlib.suppress(ValueError):
            inner = json.loads(base64.b64decode(invoke["body"], validate=True))
            return inner if isinstance(inner, dict) else {}
    return given.get("converse") if isinstance(given.get("converse"), dict) else {}


class CloudEndpoints:
    """The clouds' routes, mixed into ``Simulator``: auth, per-cloud checks, then the
    same rendering and delivery (pacing, failures at token N) as every route."""

    vertex_token_ttl: float = DEFAULT_TOKEN_TTL  # seconds a Vertex access token lives
    tokens: TokenIssuer

    async def _json(self, conn: Connection, request: Request, status: int, payload: object,
                    record: Record | None = None, extra: dict[str, str] | None = None) -> bool:
        raise NotImplementedError

    async def _deliver(self, conn: Connection, request: Request, record: Record, renderer: wire.Renderer,
                       d: Directives, stream: bool) -> bool:
        raise NotImplementedError

    async def _count(self, conn: Connection, request: Request, record: Record, gemini_model: str | None) -> bool:
        raise NotImplementedError

    def _credential(self, call: CloudCall, request: Request) -> str | None:
        """The credential's directives (a ``sim:…`` key), after checking it as the cloud would."""
        if call.cloud == "bedrock":
            return bedrock_credential(request)
        if call.cloud == "vertex":
            return email_directives(self.tokens.client_of(request))
        auth = request.headers.get("authorization", "")
        key = request.headers.get("api-key") or (auth[7:].strip() if auth[:7].lower() == "bearer " else "")
        if not key:
            raise AuthRefused(401, wire.error_body("azure-chat", 401, message=(
                "Access denied due to missing subscription key. Make sure to include the key in the api-key header.")))
        return key

    async def _cloud(self, conn: Connection, request: Request, record: Record, call: CloudCall) -> bool:
        record.protocol = f"{call.cloud}-embeddings" if call.embeddings else call.protocol
        parsed = request.parsed_body()
        record.body = parsed
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        if call.embeddings:
            texts = embeddings.embedding_texts(call.embeddings, body)
        elif call.operation == "count-tokens":
            texts = prompt_texts(call.protocol, counted_input(body))
        else:
            texts = prompt_texts(call.protocol, body)
        refused: AuthRefused | None = None
        try:
            credential = self._credential(call, request)
        except AuthRefused as exc:
            refused, credential = exc, None
        raw = gather_directives(credential, texts, request.headers.get("x-sim"))
        d = Directives.from_raw(raw)
        model = call.model or (body.get("model") if isinstance(body.get("model"), str) else None)
        # Azure, like OpenAI, streams when the body asks; Bedrock and Vertex by the route.
        stream = call.stream or (call.cloud == "azure" and body.get("stream") is True)
        record.directives, record.tag, record.model, record.stream = raw, d.tag, model, stream
        if refused is not None:
            return await self._json(conn, request, refused.status, refused.body, record, refused.headers)
        if call.operation == "count-tokens":
            record.completed = True
            return await self._json(conn, request, 200, {"inputTokens": count_words(texts)}, record)
        if (call.cloud == "vertex" and model == "count-tokens") or call.operation == "countTokens":
            return await self._count(conn, request, record, model if call.operation == "countTokens" else None)

        renderer = _renderer(call, build_script(call.protocol, model, body, texts, d, request), d)

        def fail(status: int, reason: str | None = None, message: str | None = None,
                 extra: dict[str, str] | None = None) -> Coroutine[Any, Any, bool]:
            headers = {**renderer.error_headers(status, reason), **(extra or {})}
            return self._json(conn, request, status, renderer.error_body(status, reason, message), record, headers)

        if d.status is not None:
            return await fail(d.status, d.reason, extra={"retry-after": d.retry_after} if d.retry_after else None)
        if call.cloud == "azure" and d.content_filter:
            return await self._json(conn, request, 400, content_filter_error(), record)
        if not isinstance(parsed, dict):
            return await fail(400, message="simulated upstream: the body is not a JSON object")
        if problem := _invalid(call, body, texts):
            return await fail(400, message=problem)
        if call.embeddings:
            # Nothing streams, so of the timing directives only the wait before the answer applies.
            await conn.sleep(d.first_delay)
            record.completed = True
            answer = embeddings.embedding_body(call.embeddings, body, texts, model or "sim-embedding")
            counted = {"x-amzn-bedrock-input-token-count": str(count_words(texts))} if call.cloud == "bedrock" else None
            return await self._json(conn, request, 200, answer, record, counted)
        return await self._deliver(conn, request, record, renderer, d, stream)

    async def _token(self, conn: Connection, request: Request, record: Record) -> bool:
        """Google's OAuth2 token endpoint, for the JWT-bearer grant of a service account."""
        record.protocol = "oauth2"
        form = dict(parse_qsl(request.body.decode("latin-1"), keep_blank_values=True))
        host = request.headers.get("host", "")
        # google-auth signs every grant for Google's own endpoint whatever the key's
        # token_uri, and Google takes that; a signer using the token_uri is right too.
        audiences = [GOOGLE_TOKEN_URI, *(f"{scheme}://{host}{request.path}" for scheme in ("http", "https"))]
        status, answer = self.tokens.exchange(form, audiences, self.vertex_token_ttl)
        record.body = {"grant_type": form.get("grant_type")}
        record.completed = status == 200
        return await self._json(conn, request, status, answer, record, {"cache-control": "no-store"})

    async def _token_control(self, conn: Connection, request: Request) -> bool:
        if request.method == "POST":
            with contextlib.suppress(KeyError, ValueError):  # a bad ttl changes nothing
                self.vertex_token_ttl = max(float(request.query["ttl"]), 0.0)
            if request.query.get("revoke"):
                self.tokens.revoke()
        return await self._json(conn, request, 200, {**self.tokens.summary(), "ttl": self.vertex_token_ttl})


def _renderer(call: CloudCall, script: wire.Script, d: Directives) -> wire.Renderer:
    renderer_class = wire.RENDERERS[call.protocol]
    if issubclass(renderer_class, BedrockRenderer):
        return renderer_class(script, BAD_CRC if d.bad_crc else d.exception)
    if issubclass(renderer_class, AzureChatRenderer):
        return renderer_class(script, d.filter_finish)
    return renderer_class(script)


def _invalid(call: CloudCall, body: dict[str, Any], texts: list[str]) -> str | None:
    """What the cloud would refuse in a body sent to it, if anything."""
    if call.embeddings:
        return embeddings.too_many(call.embeddings, call.model or "", texts) if texts else \
            "simulated upstream: nothing to embed"
    if call.protocol not in ("bedrock-anthropic", "vertex-anthropic"):
        return None
    if call.protocol == "bedrock-anthropic" and "anthropic." not in (call.model or ""):
        return "simulated upstream: invoke takes Anthropic and embedding models here; use Converse"
    # The clouds' own versions are bedrock-2023-05-31 and vertex-2023-10-16; newer
    # anthropic SDKs send a dated API version instead, which the clouds take too.
    if not isinstance(body.get("anthropic_version"), str) or not body["anthropic_version"]:
        return f"required key [anthropic_version] not found (e.g. {_ANTHROPIC_VERSIONS[call.cloud]!r})"
    extraneous = [key for key in ("model", "stream") if key in body and (call.cloud == "bedrock" or key == "model")]
    return f"extraneous key [{extraneous[0]}] is not permitted" if extraneous else None
