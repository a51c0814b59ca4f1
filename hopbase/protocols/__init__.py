"""One module per wire protocol, each behind the interface in ``base``."""

from core.usage import Usage
from hopbase.protocols.anthropic_messages import Messages
from hopbase.protocols.base import Api, Mark, RequestFacts, StreamWatcher
from hopbase.protocols.gemini import Gemini
from hopbase.protocols.openai_chat import ChatCompletions
from hopbase.protocols.openai_responses import Responses

CHAT = ChatCompletions()
RESPONSES = Responses()
MESSAGES = Messages()
GEMINI = Gemini()

__all__ = ["CHAT", "GEMINI", "MESSAGES", "RESPONSES", "Mark", "Api", "RequestFacts", "StreamWatcher", "Usage"]
