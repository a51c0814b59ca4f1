"""Gemini ``contents`` (turns of parts) to and from neutral messages.

The message half of ``gemini_request``: a Gemini client's turns decoded into
``Message``s, and ``Message``s encoded as the turns a Gemini channel takes.
Also here: the casing the google-genai SDK mixes (camelCase and snake_case
keys in one body), and how thinking state of another protocol travels in a
Gemini client's ``thoughtSignature`` (``gemini_stream``'s writer seals it,
``decode_contents`` opens it on the next turn).
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import re
from functools import cache
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from core.errors import ErrorKind, GatewayError
from core.vocabulary import WireGrammar
from providers.base import dumps
from providers.neutral import Image, Message, Part, Text, Thinking, ToolCall, ToolResult, seal, unseal

GEMINI = WireGrammar.GEMINI
# The part kinds a client may send, under either casing, by their camelCase name.
PART_KINDS = {
    name: camel
    for camel in ("text", "inlineData", "fileData", "functionCall", "functionResponse",
                  "executableCode", "codeExecutionResult", "videoMetadata")
    for name in (camel, re.sub(r"([A-Z])", r"_\1", camel).lower())
}
# Parts only Gemini runs or reads (its code sandbox, video clipping).
UNTRANSLATABLE_PARTS = {"executableCode", "codeExecutionResult", "videoMetadata"}
# The SDK reads ``thoughtSignature`` as base64 bytes (and sends back their
# urlsafe base64), so sealed state travels base64-encoded (every such value
# starts "aGIxL", the base64 of the seal's "hb1."); redacted thinking
# (Anthropic's) is marked after the seal, so that it goes back as redacted.
REDACTED_MARK = "~redacted"
# https://ai.google.dev/gemini-api/docs/thought-signatures: for function calls Gemini did not make.
SKIP_SIGNATURE = "skip_thought_signature_validator"


def malformed(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED, message, param=param)


@cache
def _snake(camel: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", camel).lower()


def key_of(mapping: Any, camel: str) -> str | None:
    """The key ``mapping`` has for ``camel``, as the caller wrote it."""
    if not isinstance(mapping, dict):
        return None
    if camel in mapping:
        return camel
    snake = _snake(camel)
    return snake if snake in mapping else None


def field(mapping: Any, camel: str) -> Any:
    key = key_of(mapping, camel)
    return None if key is None else mapping[key]


def add_once(names: list[str], name: str) -> None:
    if name not in names:
        names.append(name)


def function_name(value: Any, param: str) -> str:
    name = field(value, "name")
    if not isinstance(name, str) or not name:
        raise malformed(f"`{param}.name` is required and must be a string.", f"{param}.name")
    return name


def sealed_signature(origin: WireGrammar, signature: str, redacted: bool = False) -> str:
    """The ``thoughtSignature`` a Gemini client is handed for thinking state."""
    if origin == GEMINI and not redacted:
        return signature
    text = seal(origin, signature) + (REDACTED_MARK if redacted else "")
    return base64.urlsafe_b64encode(text.encode()).decode()


def opened_signature(value: str) -> Thinking:
    """A ``thoughtSignature`` a client sent back, as the thinking state it stands for."""
    try:
        text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (ValueError, binascii.Error):
        text = value  # a REST client may hand back the sealed text as it is
    redacted = text.endswith(REDACTED_MARK)
    opened = unseal(text.removesuffix(REDACTED_MARK))
    if opened is None:
        return Thinking(signature=value, origin=GEMINI)
    return Thinking(signature=opened[1], origin=opened[0], redacted=redacted)


# -- decode: a client's contents -> messages ----------------------------------


class _Calls:
    """Ids for function calls sent without one (made up, the same on every
    decode of the same history), and the calls still awaiting a response:
    Gemini pairs a response without an id to the earliest call of its name."""

    def __init__(self) -> None:
        self.count = 0
        self.waiting: dict[str, list[str]] = {}

    def _new_id(self) -> str:
        self.count += 1
        return f"call_{self.count}"

    def call(self, name: str, given: Any) -> str:
        call_id = given if isinstance(given, str) and given else self._new_id()
        self.waiting.setdefault(name, []).append(call_id)
        return call_id

    def result(self, name: str, given: Any) -> str:
        waiting = self.waiting.get(name, [])
        if isinstance(given, str) and given:
            if given in waiting:
                waiting.remove(given)
            return given
        return waiting.pop(0) if waiting else self._new_id()


def decode_contents(contents: list[Any], untranslatable: list[str]) -> list[Message]:
    calls = _Calls()
    messages: list[Message] = []
    for i, content in enumerate(contents):
        param = f"contents[{i}]"
        if not isinstance(content, dict):
            raise malformed(f"`{param}` must be an object with `role` and `parts`.", param)
        raw_parts = content.get("parts") or []
        if not isinstance(raw_parts, list):
            raise malformed(f"`{param}.parts` must be an array.", f"{param}.parts")
        parts = _parts(raw_parts, f"{param}.parts", calls, untranslatable)
        if parts:
            messages.append(Message("assistant" if content.get("role") == "model" else "user", parts))
    return messages


def _parts(raw_parts: list[Any], param: str, calls: _Calls, untranslatable: list[str]) -> list[Part]:
    parts: list[Part] = []
    for j, part in enumerate(raw_parts):
        if not isinstance(part, dict):
            raise malformed(f"`{param}[{j}]` must be an object.", f"{param}[{j}]")
        kind = next((k for k in part if k in PART_KINDS), None)
        camel = PART_KINDS.get(kind or "")
        thought = camel == "text" and bool(part.get("thought"))
        signature = field(part, "thoughtSignature")
        if thought or isinstance(signature, str) and signature:
            _thinking(parts, part[kind] if thought else None, signature)
            if thought:
                continue
        if kind is None:
            continue
        value = part[kind]
        where = f"{param}[{j}].{kind}"
        if camel in UNTRANSLATABLE_PARTS:
            add_once(untranslatable, kind)
        elif camel == "text":
            if not isinstance(value, str):
                raise malformed(f"`{where}` must be a string.", where)
            if value:
                parts.append(Text(value))
        elif camel in ("inlineData", "fileData"):
            image = _image(value, camel)
            if image is None:
                add_once(untranslatable, kind)
            else:
                parts.append(image)
        elif camel == "functionCall":
            name = function_name(value, where)
            parts.append(ToolCall(calls.call(name, value.get("id")), name, dumps(field(value, "args") or {}).decode()))
        elif camel == "functionResponse":
            name = function_name(value, where)
            parts.append(_tool_result(value, name, calls.result(name, value.get("id")), untranslatable))
    return parts


def _thinking(parts: list[Part], text: Any, signature: Any) -> None:
    """Thought text and thinking state. A signature closes the thinking
    before it (Gemini puts it on the part after the thoughts), so an unsigned
    thinking just before takes it; otherwise it stands alone before its part."""
    previous = parts[-1] if parts else None
    sealed = opened_signature(signature) if isinstance(signature, str) and signature else None
    thinking = previous if isinstance(previous, Thinking) and previous.signature is None else None
    if thinking is None or sealed is not None and sealed.redacted:
        thinking = sealed or Thinking()
        parts.append(thinking)
    elif sealed is not None:
        thinking.signature, thinking.origin = sealed.signature, sealed.origin
    if isinstance(text, str):
        thinking.text += text


def _image(value: Any, camel: str) -> Image | None:
    """An image part; None for other media (audio, video, PDF) and for
    files held by Google (Files API, Cloud Storage), which only Gemini reads."""
    mime = field(value, "mimeType")
    if mime is not None and not (isinstance(mime, str) and mime.startswith("image/")):
        return None
    if camel == "inlineData":
        data = field(value, "data")
        return Image(media_type=mime, data=data) if isinstance(data, str) else None
    uri = field(value, "fileUri")
    if not isinstance(uri, str) or not uri.startswith(("http://", "https://")) or "googleapis.com/" in uri:
        return None
    return Image(url=uri, media_type=mime)


def _tool_result(value: dict[str, Any], name: str, call_id: str, untranslatable: list[str]) -> ToolResult:
    response = field(value, "response")
    is_error = False
    # ``{"result": text}`` / ``{"error": text}`` (what ``encode`` sends, and
    # what the SDK's automatic function calling sends) is the text itself.
    if isinstance(response, dict) and len(response) == 1 and isinstance(next(iter(response.values())), str):
        is_error = "error" in response
        text = next(iter(response.values()))
    else:
        text = dumps(response if response is not None else {}).decode()
    content: list[Text | Image] = [Text(text)]
    for part in field(value, "parts") or []:
        kind = next((k for k in part if k in PART_KINDS), "") if isinstance(part, dict) else ""
        image = _image(part[kind], PART_KINDS[kind]) if PART_KINDS.get(kind) in ("inlineData", "fileData") else None
        if image is None:
            add_once(untranslatable, "functionResponse.parts")
        else:
            content.append(image)
    return ToolResult(call_id, content, is_error, name)


# -- encode: messages -> a channel's contents ---------------------------------


def encode_contents(messages: list[Message]) -> list[dict[str, Any]]:
    names: dict[str, str] = {}  # call id -> function name: Gemini names each response
    contents: list[dict[str, Any]] = []
    for message in messages:
        parts = _parts_out(message.parts, names)
        if not parts:
            continue
        role = "model" if message.role == "assistant" else "user"
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    for content in contents:
        if content["role"] == "model":
            _sign_calls(content["parts"])
    return contents


def _sign_calls(parts: list[dict[str, Any]]) -> None:
    """Gemini 3 refuses a turn's function calls without Gemini's thinking
    state; calls another provider made (or a caller could not keep it for)
    carry the sentinel Google documents for that, on the first call only."""
    if any("thoughtSignature" in part for part in parts):
        return
    call = next((part for part in parts if "functionCall" in part), None)
    if call is not None:
        call["thoughtSignature"] = SKIP_SIGNATURE


def _parts_out(parts: list[Part], names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    signature: str | None = None  # Gemini's own thinking state goes on the part after it
    for part in parts:
        items: list[dict[str, Any]]
        match part:
            case Thinking(signature=str() as state, origin=WireGrammar.GEMINI, redacted=False) if state:
                signature = state
                continue
            case Text(text=text):
                items = [{"text": text}] if text else []
            case Image():
                items = [_image_out(part)]
            case ToolCall(call_id=call_id, name=name):
                names[call_id] = name
                items = [{"functionCall": {"name": name, "args": _arguments(part.arguments), "id": call_id}}]
            case ToolResult():
                items = _result_out(part, names)
            case _:
                continue  # others' thinking, and thought text: Gemini takes back only its signatures
        if items and signature is not None:
            items[0]["thoughtSignature"] = signature
            signature = None
        out.extend(items)
    if signature is not None:
        out.append({"text": "", "thoughtSignature": signature})
    return out


def _arguments(text: str) -> dict[str, Any]:
    try:
        args = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _result_out(result: ToolResult, names: dict[str, str]) -> list[dict[str, Any]]:
    name = names.get(result.call_id) or result.name
    if not name:
        raise malformed("A tool result answers no tool call in the conversation.", "contents")
    text = "".join(p.text for p in result.content if isinstance(p, Text))
    response = {"error": text} if result.is_error else {"result": text}
    out: list[dict[str, Any]] = [{"functionResponse": {"name": name, "id": result.call_id, "response": response}}]
    # Images a tool returned travel beside its response (every Gemini model takes those).
    out.extend(_image_out(p) for p in result.content if isinstance(p, Image))
    return out


def _image_out(image: Image) -> dict[str, Any]:
    if image.data is not None:
        return {"inlineData": {"mimeType": image.media_type or "image/png", "data": image.data}}
    url = image.url or ""
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        mime = header[5:].split(";")[0] or "image/png"
        if ";base64" not in header:
            data = base64.b64encode(unquote_to_bytes(data)).decode()
        return {"inlineData": {"mimeType": mime, "data": data}}
    mime = image.media_type or mimetypes.guess_type(url.split("?")[0])[0] or "image/jpeg"
    return {"fileData": {"mimeType": mime, "fileUri": url}}
