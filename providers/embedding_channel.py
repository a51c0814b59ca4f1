"""A channel's embeddings endpoint as a translated request reaches it
(rules V2, V3): one JSON body in, one out, in the grammar the channel's kind
names for the model (``ChannelKind.embedding_grammar``), the body written by
``providers.embedding_legs``. A batch larger than the channel takes is
sent in parts (``RequestFacts.parts``). Its failures are judged as the
grammar's own vendor judges them (a Gemini key refused with a 400 is the
channel's fault).
"""

from __future__ import annotations

from core.errors import UpstreamFailure
from providers.base import Api, RequestFacts
from providers.kind import Call, Operation


class EmbeddingChannel(Api):
    operation = Operation.EMBED
    upstream_streams = False

    def __init__(self, judged_as: Api) -> None:
        self.judged_as = judged_as

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        return Call(self.operation, facts.model, facts.body, facts.raw_body, route=facts.route)

    def upstream_failure(self, status: int, body: bytes, retry_after: int | None) -> UpstreamFailure:
        return self.judged_as.upstream_failure(status, body, retry_after)

    def slow_start_applies(self, model: str, facts: RequestFacts) -> bool:
        return False
