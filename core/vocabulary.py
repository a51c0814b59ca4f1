"""The domain's named words, each defined once.

``ApiName``      the API a client called (the export's ``protocol`` column,
                 the metrics' ``protocol`` label)
``WireGrammar`` the grammar a channel (a provider account) speaks for a model
``EmbeddingGrammar`` the grammar of a channel's embeddings endpoint for a model
``ChannelKindName`` where a channel is and how it is reached: a vendor's own
                 API or a cloud (a channel's ``protocol`` field)
``RequestStatus`` how a request ended (the request log's ``status``)
"""

from __future__ import annotations

from django.db import models


class ApiName(models.TextChoices):
    CHAT = "chat", "OpenAI Chat Completions"
    RESPONSES = "responses", "OpenAI Responses"
    MESSAGES = "messages", "Anthropic Messages"
    GEMINI = "gemini", "Gemini"
    EMBEDDINGS = "embeddings", "OpenAI Embeddings"


class WireGrammar(models.TextChoices):
    OPENAI = "openai", "OpenAI (Chat Completions and Responses)"
    ANTHROPIC = "anthropic", "Anthropic Messages"
    GEMINI = "gemini", "Gemini"
    CONVERSE = "converse", "Amazon Bedrock Converse"


class EmbeddingGrammar(models.TextChoices):
    OPENAI = "openai", "OpenAI embeddings (and Azure's deployments)"
    GEMINI = "gemini", "Gemini batchEmbedContents"
    VERTEX = "vertex", "Vertex AI predict"
    TITAN = "titan", "Amazon Titan embeddings on Bedrock"
    COHERE = "cohere", "Cohere embeddings on Bedrock"


class ChannelKindName(models.TextChoices):
    OPENAI = "openai", "OpenAI"
    ANTHROPIC = "anthropic", "Anthropic"
    GEMINI = "gemini", "Gemini (Google AI Studio)"
    AZURE = "azure", "Azure OpenAI"
    BEDROCK = "bedrock", "Amazon Bedrock"
    VERTEX = "vertex", "Google Vertex AI"


class RequestStatus(models.TextChoices):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    STALLED = "stalled"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    REJECTED = "rejected"

    @property
    def cut_short(self) -> bool:
        """Ended after the channel had started answering, before its end:
        billed on what is known (B2–B4)."""
        return self in CUT_SHORT

    @property
    def billed(self) -> bool:
        return self not in UNBILLED


CUT_SHORT = frozenset({RequestStatus.CANCELLED, RequestStatus.STALLED, RequestStatus.INTERRUPTED})
UNBILLED = frozenset({RequestStatus.FAILED, RequestStatus.REJECTED})
