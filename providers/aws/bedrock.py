"""Amazon Bedrock Runtime (``bedrock``, rule C3).

Anthropic models (an id containing ``anthropic.``, inference profiles such
as ``us.anthropic.…`` included) take the Messages body at
``invoke-with-response-stream``, with Bedrock's ``anthropic_version`` and
without ``model`` and ``stream``; their events come back inside AWS's event
stream and are handed on as Anthropic's own (``eventstream``). Every other
model speaks Converse at ``converse-stream``.

Credentials, from the channel's secret:
- ``ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]``: every request is
  signed with SigV4 (botocore's signer, service ``bedrock``, the channel's
  region);
- anything else is a Bedrock API key, sent as ``Authorization: Bearer``;
- none: the gateway process's own AWS credential chain (environment, shared
  config, container or instance role), resolved and refreshed by botocore in
  a thread, so a metadata lookup never holds the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.session import Session

from core.errors import UpstreamFailure
from core.sse import EventSplitter
from core.vocabulary import ChannelKindName, EmbeddingGrammar, WireGrammar
from providers.anthropic.betas import taken_by
from providers.aws.eventstream import AnthropicFrames, ConverseFrames
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
    unsupported,
)
from providers.refresh import Refreshed

ANTHROPIC_VERSION = "bedrock-2023-05-31"
SERVICE = "bedrock"
EVENT_STREAM = "application/vnd.amazon.eventstream"
# How long the process chain's credentials are used before botocore is asked
# again (it refreshes them itself well before they expire).
CHAIN_RECHECK_SECONDS = 60.0
# Bedrock's error types that mean "busy" rather than "broken" (C5).
BUSY_ERRORS = (b"ThrottlingException", b"ServiceUnavailableException", b"ModelNotReadyException")
INPUT_TOKENS_HEADER = "x-amzn-bedrock-input-token-count"
# Where an invoke answer carries that header's count, for the embeddings' reader.
INPUT_TOKENS_FIELD = "x-amzn-bedrock-input-token-count"


def is_anthropic(model: str) -> bool:
    return "anthropic." in model


def with_input_tokens(body: bytes, headers: httpx.Headers) -> bytes:
    """An invoke answer with the input token count Bedrock gave in a header
    added to its JSON object (as it came when there is none, or no object)."""
    count = headers.get(INPUT_TOKENS_HEADER, "")
    if not count.isdigit() or not body.rstrip().endswith(b"}"):
        return body
    head = body.rstrip()[:-1].rstrip()
    separator = b"" if head.endswith(b"{") else b","
    return head + separator + b'"' + INPUT_TOKENS_FIELD.encode() + b'":' + count.encode() + b"}"


def anthropic_count(body: bytes, headers: httpx.Headers) -> bytes:
    """CountTokens' answer for an Anthropic model, as Anthropic's counting endpoint writes it."""
    try:
        return orjson.dumps({"input_tokens": orjson.loads(body)["inputTokens"]})
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body  # read as it is, and found wanting there


def key_pair(secret: str) -> ReadOnlyCredentials | None:
    """The static key pair a secret holds, or None for a Bedrock API key."""
    if ":" not in secret:
        return None
    access, secret_key, token = (secret.split(":", 2) + [""])[:3]
    return ReadOnlyCredentials(access, secret_key, token or None)


def sign(request: UpstreamRequest, credentials: ReadOnlyCredentials, region: str) -> None:
    aws = AWSRequest(method="POST", url=request.url, data=request.content, headers=request.headers)
    SigV4Auth(Credentials(*credentials), SERVICE, region).add_auth(aws)
    request.headers = dict(aws.headers.items())


class ProcessChain:
    """The gateway process's own AWS credentials, shared by every channel
    that has no key of its own."""

    def __init__(self) -> None:
        self._credentials: Any = None
        self.frozen = Refreshed(self._fetch)

    async def _fetch(self) -> tuple[ReadOnlyCredentials, float]:
        frozen = await asyncio.to_thread(self._resolve)
        return frozen, time.monotonic() + CHAIN_RECHECK_SECONDS

    def _resolve(self) -> ReadOnlyCredentials:
        if self._credentials is None:
            self._credentials = Session().get_credentials()
        if self._credentials is None:
            raise AuthFailed("no AWS credentials: the channel has no key and the process's credential chain found none")
        return self._credentials.get_frozen_credentials()


class BedrockKind(ChannelKind):
    name = ChannelKindName.BEDROCK
    settings = ("region",)
    secret_required = False

    def __init__(self) -> None:
        self.chain = ProcessChain()

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.ANTHROPIC if is_anthropic(model) else WireGrammar.CONVERSE

    def embedding_grammar(self, model: str) -> EmbeddingGrammar | None:
        if "titan-embed" in model:
            return EmbeddingGrammar.TITAN
        return EmbeddingGrammar.COHERE if "cohere.embed" in model else None

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        model = quote(call.model, safe="")
        accept, answer = EVENT_STREAM, None
        if call.operation is Operation.MESSAGES:
            url = f"{base(channel)}/model/{model}/invoke-with-response-stream"
            content = orjson.dumps(self._messages_body(call))
            splitter = AnthropicFrames
        elif call.operation is Operation.CONVERSE:
            url, content, splitter = f"{base(channel)}/model/{model}/converse-stream", call.content, ConverseFrames
        elif call.operation is Operation.EMBED:
            # One JSON body, read whole: no event stream to split.
            url, content, splitter = f"{base(channel)}/model/{model}/invoke", call.content, EventSplitter
            accept, answer = "application/json", with_input_tokens
        elif call.operation is Operation.COUNT:
            # CountTokens takes a foundation model's own id, not a cross-region profile's.
            anthropic = is_anthropic(call.model)
            counted = quote(call.model[call.model.find("anthropic."):] if anthropic else call.model, safe="")
            url, content = f"{base(channel)}/model/{counted}/count-tokens", self._count_body(call)
            splitter, accept, answer = EventSplitter, "application/json", anthropic_count if anthropic else None
        else:
            raise unsupported(self, call)
        headers = {"content-type": "application/json", "accept": accept}
        request = UpstreamRequest(url, headers, content, splitter=splitter, answer=answer)
        secret = channel.secret
        if not secret:
            region = channel.region

            async def authorize(request: UpstreamRequest, http: httpx.AsyncClient) -> None:
                sign(request, await self.chain.frozen.get(), region)

            request.authorize = authorize
        elif (pair := key_pair(secret)) is not None:
            sign(request, pair, channel.region)
        else:
            headers["authorization"] = f"Bearer {secret}"
        return request

    def _count_body(self, call: Call) -> bytes:
        """CountTokens takes the body the generation would send: an
        InvokeModel body (a blob, so base64 in JSON) for Anthropic models,
        else Converse's messages and system."""
        if is_anthropic(call.model):
            body = self._messages_body(call)
            # InvokeModel requires it (above a thinking budget); it changes no count.
            thinking = body.get("thinking") if isinstance(body.get("thinking"), dict) else {}
            budget = thinking.get("budget_tokens") if isinstance(thinking.get("budget_tokens"), int) else 0
            body.setdefault("max_tokens", budget + 1)
            blob = base64.b64encode(orjson.dumps(body)).decode()
            return orjson.dumps({"input": {"invokeModel": {"body": blob}}})
        converse = {k: v for k, v in call.body.items() if k in ("messages", "system", "toolConfig")}
        return orjson.dumps({"input": {"converse": converse}})

    @staticmethod
    def _messages_body(call: Call) -> dict[str, Any]:
        # A client's own "anthropic_beta" key never goes: the flags come from
        # its header alone, checked for surcharges (B10) and allowed for Bedrock.
        body = {k: v for k, v in call.body.items() if k not in ("model", "stream", "anthropic_beta")}
        body["anthropic_version"] = ANTHROPIC_VERSION
        # Bedrock takes Anthropic's beta flags in the body, not as a header;
        # only those it knows (it refuses the request for any other).
        if flags := taken_by("bedrock", call.headers.get("anthropic-beta")):
            body["anthropic_beta"] = flags
        return body

    def failure(
        self, channel: ChannelConfig, status: int, body: bytes, retry_after: int | None, grammar: ClassifyFailure
    ) -> UpstreamFailure:
        if status in (400, 424, 429) and any(name in body for name in BUSY_ERRORS):
            return UpstreamFailure(f"http_{status}", status, busy=True, retry_after=retry_after)
        if status == 424:
            # ModelErrorException: the model failed, not the request; another channel may serve it.
            return UpstreamFailure(f"http_{status}", status, retry_after=retry_after)
        return grammar(status, body, retry_after)

    def check(self, base_url: str, secret: str, settings: Mapping[str, str]) -> None:
        region = settings.get("region", "")
        if not region:
            raise ConfigError("region", "a bedrock channel needs --region (the AWS region, e.g. us-east-1)")
        if not all(ch.isalnum() or ch == "-" for ch in region):
            raise ConfigError("region", f"{region!r} is not an AWS region such as us-east-1")
        pair = key_pair(secret) if secret else None
        if pair is not None and not (pair.access_key and pair.secret_key):
            raise ConfigError("api_key", "a bedrock key pair is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]")
