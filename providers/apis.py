"""Every client API, one instance each (compared by identity: ``api is
RESPONSES``), each defined in its vendor's folder behind ``providers.base.Api``."""

from providers.anthropic.messages import Messages
from providers.aws.converse import Converse
from providers.base import Api, Mark, RequestFacts, StreamWatcher
from providers.google.caches import GeminiCaches
from providers.google.embeddings import GeminiEmbeddings
from providers.google.gemini import Gemini
from providers.openai.chat import ChatCompletions
from providers.openai.embeddings import Embeddings
from providers.openai.responses import Responses

CHAT = ChatCompletions()
RESPONSES = Responses()
MESSAGES = Messages()
GEMINI = Gemini()
GEMINI_CACHES = GeminiCaches()
EMBEDDINGS = Embeddings()
GEMINI_EMBEDDINGS = GeminiEmbeddings()
# A channel grammar only: no client calls Converse.
CONVERSE = Converse()

__all__ = [
    "CHAT", "CONVERSE", "EMBEDDINGS", "GEMINI", "GEMINI_CACHES", "GEMINI_EMBEDDINGS", "MESSAGES", "RESPONSES", "Api",
    "Mark", "RequestFacts", "StreamWatcher",
]
