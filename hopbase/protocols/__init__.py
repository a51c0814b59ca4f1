"""One module per wire protocol, each behind the interface in ``base``."""

from hopbase.protocols.anthropic_messages import Messages
from hopbase.protocols.base import Mark, Protocol, RequestFacts, StreamWatcher, Usage
from hopbase.protocols.gemini import Gemini
from hopbase.protocols.openai_chat import ChatCompletions
from hopbase.protocols.openai_responses import Responses

CHAT = ChatCompletions()
RESPONSES = Responses()
MESSAGES = Messages()
GEMINI = Gemini()

__all__ = ["CHAT", "GEMINI", "MESSAGES", "RESPONSES", "Mark", "Protocol", "RequestFacts", "StreamWatcher", "Usage"]
