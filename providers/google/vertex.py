"""Google Vertex AI (``vertex``, rule C4).

The channel's secret is a service-account JSON key. HopBase signs a JWT
with it (google-auth's RS256 signer, in a thread: an RSA signature is a
millisecond of CPU) and exchanges it at the key's ``token_uri`` for an
access token, sent as ``Authorization: Bearer``. The token is kept per
channel until shortly before it expires and refreshed by one exchange
however many requests are waiting (``refresh.Refreshed``); one the cloud
refuses (401) is dropped, so the next request exchanges anew.

Gemini models go to ``publishers/google`` in Gemini's grammar; Claude
models to ``publishers/anthropic`` (``streamRawPredict``) with the Messages
body, Vertex's ``anthropic_version`` and no ``model``. Embedding models take
Vertex's own ``:predict`` body (instances and parameters).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from google.auth import crypt, jwt

from core.errors import UpstreamFailure
from core.vocabulary import ChannelKindName, EmbeddingGrammar, WireGrammar
from providers.anthropic.betas import taken_by
from providers.anthropic.kind import anthropic_counted
from providers.kind import (
    AuthFailed,
    Call,
    ChannelConfig,
    ChannelKind,
    ClassifyFailure,
    ConfigError,
    Operation,
    UpstreamRequest,
    base,
    json_headers,
    stream_headers,
    unsupported,
)
from providers.refresh import Refreshed

ANTHROPIC_VERSION = "vertex-2023-10-16"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ASSERTION_LIFETIME = 3600
# A token is renewed this long before the expiry its exchange gave.
EXPIRY_MARGIN = 60.0
EXCHANGE_TIMEOUT = 10.0
# What Vertex's countTokens takes of a generateContent body.
VERTEX_COUNTED_FIELDS = ("contents", "systemInstruction", "tools", "generationConfig")
KEY_FIELDS = ("client_email", "private_key", "token_uri")


def service_account(secret: str) -> dict[str, Any]:
    """The key's JSON, checked for what an exchange needs (``ConfigError`` naming the field)."""
    try:
        info = orjson.loads(secret)
    except orjson.JSONDecodeError:
        raise ConfigError("api_key", "a vertex key must be a service-account JSON key") from None
    if not isinstance(info, dict):
        raise ConfigError("api_key", "a vertex key must be a service-account JSON key (an object)")
    for name in KEY_FIELDS:
        if not isinstance(info.get(name), str) or not info[name]:
            raise ConfigError("api_key", f"the service-account key has no {name}")
    if not info["token_uri"].startswith(("https://", "http://")):
        raise ConfigError("api_key", "the service-account key's token_uri is not an http(s) URL")
    try:
        crypt.RSASigner.from_service_account_info(info)
    except (ValueError, TypeError) as error:
        raise ConfigError("api_key", f"the service-account key's private_key cannot sign: {error}") from None
    return info


class TokenSource:
    """One channel's access tokens."""

    def __init__(self, info: dict[str, Any], broken: str = "") -> None:
        self.info = info
        self.broken = broken  # why the key cannot be used, if it cannot
        self.http: httpx.AsyncClient | None = None
        self.tokens = Refreshed(self._exchange)

    def _assertion(self) -> bytes:
        now = int(time.time())
        payload = {
            "iss": self.info["client_email"], "scope": SCOPE, "aud": self.info["token_uri"],
            "iat": now, "exp": now + ASSERTION_LIFETIME,
        }
        signer = crypt.RSASigner.from_service_account_info(self.info)
        return jwt.encode(signer, payload)

    async def _exchange(self) -> tuple[str, float]:
        assert self.http is not None
        if self.broken:
            raise AuthFailed(self.broken)
        assertion = await asyncio.to_thread(self._assertion)
        try:
            answer = await self.http.post(
                self.info["token_uri"], data={"grant_type": GRANT_TYPE, "assertion": assertion.decode()},
                timeout=EXCHANGE_TIMEOUT,
            )
        except httpx.HTTPError as error:
            raise AuthFailed(f"token exchange at {self.info['token_uri']} failed: {type(error).__name__}") from None
        if answer.status_code != 200:
            raise AuthFailed(f"token exchange refused ({answer.status_code}): {answer.text[:300]}")
        try:
            found = orjson.loads(answer.content)
            token, lifetime = found["access_token"], float(found.get("expires_in", 3600))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise AuthFailed("token exchange answered without an access token") from None
        return str(token), time.monotonic() + max(0.0, lifetime - EXPIRY_MARGIN)


class VertexKind(ChannelKind):
    name = ChannelKindName.VERTEX
    settings = ("project", "location")

    def __init__(self) -> None:
        # (channel id, key) -> its tokens: a rotated key starts afresh.
        self._sources: dict[tuple[int, str], TokenSource] = {}

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.ANTHROPIC if model.startswith("claude") else WireGrammar.GEMINI

    def embedding_grammar(self, model: str) -> EmbeddingGrammar | None:
        return None if model.startswith("claude") else EmbeddingGrammar.VERTEX

    def serves(self, operation: Operation) -> bool:
        return operation in (Operation.GENERATE, Operation.MESSAGES, Operation.EMBED, Operation.COUNT)

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        model = quote(call.model, safe="")
        publisher = f"{base(channel)}/v1/projects/{quote(channel.project, safe='')}/locations/{quote(channel.location, safe='')}/publishers"
        if call.operation is Operation.GENERATE:
            url = f"{publisher}/google/models/{model}:streamGenerateContent?alt=sse"
            content = call.content
        elif call.operation is Operation.EMBED:
            url = f"{publisher}/google/models/{model}:predict"
            content = call.content
        elif call.operation is Operation.COUNT and self.grammar(call.model) is WireGrammar.GEMINI:
            url = f"{publisher}/google/models/{model}:countTokens"
            content = orjson.dumps({k: v for k, v in call.body.items() if k in VERTEX_COUNTED_FIELDS})
        elif call.operation is Operation.COUNT:
            # Claude's counting on Vertex is one endpoint for every model, named in the body.
            url, content = f"{publisher}/anthropic/models/count-tokens:rawPredict", anthropic_counted(call.body, call.model)
        elif call.operation is Operation.MESSAGES:
            url = f"{publisher}/anthropic/models/{model}:streamRawPredict"
            # Beta flags go in the header only (checked and allowed): never a client's "anthropic_beta" key.
            body = {k: v for k, v in call.body.items() if k not in ("model", "anthropic_beta")}
            body["anthropic_version"] = ANTHROPIC_VERSION
            body["stream"] = True
            content = orjson.dumps(body)
        else:
            raise unsupported(self, call)
        source = self.source(channel)

        async def authorize(request: UpstreamRequest, http: httpx.AsyncClient) -> None:
            source.http = http
            request.headers["authorization"] = f"Bearer {await source.tokens.get()}"

        headers = json_headers(call) if call.operation in (Operation.EMBED, Operation.COUNT) else stream_headers(call)
        headers.pop("anthropic-version", None)  # the body names Vertex's own
        if "anthropic-beta" in headers:  # only the flags Vertex knows: it refuses the request for any other
            flags = taken_by("vertex", headers.pop("anthropic-beta"))
            if flags:
                headers["anthropic-beta"] = ",".join(flags)
        return UpstreamRequest(url, headers, content, authorize=authorize)

    def source(self, channel: ChannelConfig) -> TokenSource:
        key = (channel.id, channel.secret)
        found = self._sources.get(key)
        if found is None:
            try:
                found = TokenSource(service_account(channel.secret))
            except ConfigError as error:
                found = TokenSource({}, broken=error.message)
            self._sources[key] = found
        return found

    def failure(
        self, channel: ChannelConfig, status: int, body: bytes, retry_after: int | None, grammar: ClassifyFailure
    ) -> UpstreamFailure:
        if status == 401:
            self.source(channel).tokens.invalidate()
        return grammar(status, body, retry_after)

    def check(self, base_url: str, secret: str, settings: Mapping[str, str]) -> None:
        for name in ("project", "location"):
            value = settings.get(name, "")
            if not value:
                raise ConfigError(name, f"a vertex channel needs --{name}")
            if not all(ch.isalnum() or ch in "-_." for ch in value):
                raise ConfigError(name, f"{value!r} is not a Google Cloud {name}")
        service_account(secret)
