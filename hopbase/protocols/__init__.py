"""One module per client API, each behind the interface in ``base``."""

from hopbase.protocols.anthropic_messages import Messages
from hopbase.protocols.base import Api, Mark, RequestFacts, StreamWatcher
from hopbase.protocols.bedrock_converse import Converse
from hopbase.protocols.gemini import Gemini
from hopbase.protocols.gemini_caches import GeminiCaches
from hopbase.protocols.gemini_embeddings import GeminiEmbeddings
from hopbase.protocols.openai_chat import ChatCompletions
from hopbase.protocols.openai_embeddings import Embeddings
from hopbase.protocols.openai_responses import Responses

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
