"""OpenAI Chat Completions requests <-> the neutral ``Conversation``.

``decode`` reads a Chat caller's body (after ``ChatCompletions.parse``) into
a ``Conversation`` for a channel of another protocol; ``encode`` writes a
``Conversation`` as the Chat Completions request an ``openai`` channel is
called with when translating (always streaming, always with usage).
"""

from __future__ import annotations

from typing import Any

from core.errors import ErrorKind, GatewayError
from providers.base import RequestFacts, dumps, prompt_text_chars
from providers.neutral import (
    CannotServe,
    Conversation,
    Effort,
    Image,
    Message,
    OutputFormat,
    Part,
    Reasoning,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
)

# OpenAI's efforts above "high" have no equivalent elsewhere: the nearest is "high".
EFFORTS = {
    "minimal": Effort.MINIMAL,
    "low": Effort.LOW,
    "medium": Effort.MEDIUM,
    "high": Effort.HIGH,
    "xhigh": Effort.HIGH,
    "max": Effort.HIGH,
}
TOOL_CHOICE_MODES = ("auto", "none", "required")


def malformed(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED, message, param=param)


# -- decode: the caller's body -> Conversation -----------------------------------


def decode(facts: RequestFacts) -> Conversation:
    body = facts.body
    conversation = Conversation(model=facts.model, messages=[], stream=facts.stream)
    conversation.untranslatable.extend(untranslatable_fields(body))
    read_messages(body["messages"], conversation)
    read_tools(body, conversation)
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    conversation.max_tokens = number(body.get(limit), limit, int)
    conversation.temperature = number(body.get("temperature"), "temperature", float)
    conversation.top_p = number(body.get("top_p"), "top_p", float)
    stop = body.get("stop")
    conversation.stop = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
    conversation.output = output_format(body.get("response_format"))
    conversation.reasoning = reasoning(body.get("reasoning_effort"))
    parallel = body.get("parallel_tool_calls")
    conversation.parallel_tool_calls = parallel if isinstance(parallel, bool) else None
    user = body.get("user") or body.get("safety_identifier")
    conversation.user = user if isinstance(user, str) else None
    return conversation


def untranslatable_fields(body: dict[str, Any]) -> list[str]:
    """Fields that change the answer and that only OpenAI honours."""
    found = []
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        found.append("n")
    if body.get("logprobs"):
        found.append("logprobs")
    if body.get("top_logprobs"):
        found.append("top_logprobs")
    if body.get("audio"):
        found.append("audio")
    if "audio" in (body.get("modalities") or ()):
        found.append("modalities")
    if body.get("prediction"):
        found.append("prediction")
    if body.get("web_search_options") is not None:
        found.append("web_search_options")
    return found


def number(value: Any, name: str, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise malformed(f"`{name}` must be a number.", name)
    return kind(value)


def read_messages(messages: list[Any], conversation: Conversation) -> None:
    # Tool names by call id: Gemini answers a call by the function's name.
    names: dict[str, str] = {}
    out = conversation.messages
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise malformed(f"`messages[{i}]` must be an object.", f"messages[{i}]")
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            text = "".join(p.text for p in content_parts(content, i, conversation) if isinstance(p, Text))
            if text:
                conversation.system.append(text)
        elif role == "user":
            out.append(Message("user", content_parts(content, i, conversation)))
        elif role == "assistant":
            out.append(Message("assistant", assistant_parts(message, i, names)))
        elif role in ("tool", "function"):
            result = tool_result(message, i, names, conversation)
            # Results of one turn's calls travel together, as one user turn.
            if out and out[-1].role == "user" and all(isinstance(p, ToolResult) for p in out[-1].parts):
                out[-1].parts.append(result)
            else:
                out.append(Message("user", [result]))
        else:
            raise malformed(f"`messages[{i}].role` must be system, developer, user, assistant or tool.",
                            f"messages[{i}].role")


def content_parts(content: Any, i: int, conversation: Conversation) -> list[Text | Image]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)]
    if not isinstance(content, list):
        raise malformed(f"`messages[{i}].content` must be a string or an array.", f"messages[{i}].content")
    parts: list[Text | Image] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal"):
            parts.append(Text(str(part.get(kind) or "")))
        elif kind == "image_url":
            parts.append(image(part.get("image_url"), i))
        elif kind in ("input_audio", "file"):
            if kind not in conversation.untranslatable:
                conversation.untranslatable.append(kind)
        else:
            raise malformed(f"`messages[{i}].content` has a part of unknown type {kind!r}.", f"messages[{i}].content")
    return parts


def image(value: Any, i: int) -> Image:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise malformed(f"`messages[{i}]` has an image_url part without a url.", f"messages[{i}].content")
    if not url.startswith("data:"):
        return Image(url=url)
    header, _, data = url[5:].partition(",")
    media_type, _, encoding = header.partition(";")
    if encoding != "base64":
        raise malformed(f"`messages[{i}]` has an image data URL that is not base64.", f"messages[{i}].content")
    return Image(media_type=media_type, data=data)


def assistant_parts(message: dict[str, Any], i: int, names: dict[str, str]) -> list[Part]:
    parts: list[Part] = []
    # Reasoning text some compatible servers hand out; no signature goes with it.
    reasoning_text = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning_text, str) and reasoning_text:
        parts.append(Thinking(text=reasoning_text))
    content = message.get("content")
    if isinstance(content, str):
        if content:
            parts.append(Text(content))
    elif isinstance(content, list):
        parts.extend(Text(str(p.get(p.get("type")) or "")) for p in content
                     if isinstance(p, dict) and p.get("type") in ("text", "refusal"))
    calls = list(message.get("tool_calls") or ())
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        calls.append({"id": f"call_fn{len(names)}", "function": legacy})
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise malformed(f"`messages[{i}].tool_calls` needs a function with a name.", f"messages[{i}].tool_calls")
        call_id = str(call.get("id") or f"call_fn{len(names)}")
        names[call_id] = function["name"]
        arguments = function.get("arguments")
        parts.append(ToolCall(call_id, function["name"], arguments if isinstance(arguments, str) else "{}"))
    return parts


def tool_result(message: dict[str, Any], i: int, names: dict[str, str], conversation: Conversation) -> ToolResult:
    call_id = message.get("tool_call_id")
    name = message.get("name")
    if message["role"] == "function":
        # Legacy function results name the function, not a call: the latest call of it.
        call_id = next((cid for cid, n in reversed(names.items()) if n == name), f"call_fn{len(names)}")
    if not isinstance(call_id, str):
        raise malformed(f"`messages[{i}].tool_call_id` is required.", f"messages[{i}].tool_call_id")
    content = [p for p in content_parts(message.get("content"), i, conversation) if isinstance(p, Text)]
    return ToolResult(call_id, content, name=names.get(call_id, name if isinstance(name, str) else None))


def read_tools(body: dict[str, Any], conversation: Conversation) -> None:
    tools = body.get("tools")
    if tools is None and isinstance(body.get("functions"), list):
        tools = [{"type": "function", "function": f} for f in body["functions"]]
    for tool in tools or ():
        if not isinstance(tool, dict) or tool.get("type") != "function":
            if "tools" not in conversation.untranslatable:
                conversation.untranslatable.append("tools")
            continue
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise malformed("Every function tool needs `function.name`.", "tools")
        parameters = function.get("parameters")
        conversation.tools.append(Tool(
            name=function["name"],
            description=function.get("description") or "",
            parameters=parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}},
        ))
    choice = body.get("tool_choice", body.get("function_call"))
    conversation.tool_choice = tool_choice(choice, conversation)


def tool_choice(choice: Any, conversation: Conversation) -> ToolChoice | None:
    if choice is None:
        return None
    if choice in TOOL_CHOICE_MODES:
        return ToolChoice(choice)
    if isinstance(choice, dict):
        function = choice.get("function") if "function" in choice else choice
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return ToolChoice("tool", function["name"])
        if choice.get("type") == "allowed_tools":
            # Only some tools allowed: the same as offering only those.
            allowed = choice.get("allowed_tools") or {}
            names = {(t.get("function") or {}).get("name") for t in allowed.get("tools") or () if isinstance(t, dict)}
            conversation.tools = [t for t in conversation.tools if t.name in names]
            mode = allowed.get("mode")
            return ToolChoice(mode if mode in TOOL_CHOICE_MODES else "auto")
    if "tool_choice" not in conversation.untranslatable:
        conversation.untranslatable.append("tool_choice")
    return None


def output_format(value: Any) -> OutputFormat | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return OutputFormat()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise malformed("`response_format.json_schema` must be an object with a `schema`.", "response_format")
        return OutputFormat(schema=spec.get("schema") or {}, name=str(spec.get("name") or "response"),
                            strict=spec.get("strict") is True)
    return None


def reasoning(effort: Any) -> Reasoning | None:
    if effort is None:
        return None
    if effort == "none":
        return Reasoning(enabled=False)
    if not isinstance(effort, str) or effort not in EFFORTS:
        raise malformed("`reasoning_effort` must be one of none, minimal, low, medium, high, xhigh.",
                        "reasoning_effort")
    return Reasoning(effort=EFFORTS[effort])


# -- encode: Conversation -> the request for an openai channel ---------------------


def encode(conversation: Conversation, model: str) -> RequestFacts:
    if conversation.untranslatable:
        raise CannotServe(conversation.untranslatable[0])
    messages: list[dict[str, Any]] = []
    if conversation.system:
        messages.append({"role": "system", "content": "\n\n".join(conversation.system)})
    for message in conversation.messages:
        if message.role == "assistant":
            messages.extend(assistant_message(message))
        else:
            messages.extend(user_messages(message))
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if conversation.tools:
        body["tools"] = [function_tool(tool) for tool in conversation.tools]
        if conversation.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = conversation.parallel_tool_calls
        # OpenAI refuses a tool_choice (even "auto") without tools.
        if conversation.tool_choice is not None:
            body["tool_choice"] = encode_tool_choice(conversation.tool_choice)
    if conversation.max_tokens is not None:
        body["max_completion_tokens"] = conversation.max_tokens
    if conversation.temperature is not None:
        body["temperature"] = conversation.temperature
    if conversation.top_p is not None:
        body["top_p"] = conversation.top_p
    if conversation.stop:
        body["stop"] = conversation.stop
    if conversation.output is not None:
        body["response_format"] = response_format(conversation.output)
    # Thinking turned off is left unsaid: models without reasoning refuse any
    # reasoning_effort, and older reasoning models refuse "none".
    asked = conversation.reasoning
    thinking = asked is not None and asked.enabled
    if asked is not None and asked.enabled:
        body["reasoning_effort"] = asked.level().value
    if conversation.user:
        body["user"] = conversation.user
    return RequestFacts(model=model, stream=True, body=body, raw_body=dumps(body), thinking=thinking,
                        prompt_chars=prompt_text_chars(messages))


def user_messages(message: Message) -> list[dict[str, Any]]:
    """A user turn: its tool results first (each a ``tool`` message, which
    must follow the assistant's calls directly), then what the user said,
    with any images the results carried (a ``tool`` message takes text only)."""
    out: list[dict[str, Any]] = []
    said: list[Text | Image] = []
    for part in message.parts:
        if isinstance(part, ToolResult):
            text = "".join(p.text for p in part.content if isinstance(p, Text))
            out.append({"role": "tool", "tool_call_id": part.call_id, "content": text})
            said.extend(p for p in part.content if isinstance(p, Image))
        elif isinstance(part, Text | Image):
            said.append(part)
    if said:
        content: Any = said[0].text if len(said) == 1 and isinstance(said[0], Text) else [
            content_part(p) for p in said]
        out.append({"role": "user", "content": content})
    return out


def content_part(part: Text | Image) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    url = part.url if part.url is not None else f"data:{part.media_type};base64,{part.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def assistant_message(message: Message) -> list[dict[str, Any]]:
    # Thinking is dropped: Chat has no field that carries it back with a signature.
    text = "".join(p.text for p in message.parts if isinstance(p, Text))
    calls = [
        {"id": p.call_id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
        for p in message.parts if isinstance(p, ToolCall)
    ]
    if not text and not calls:
        return []
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return [out]


def function_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def encode_tool_choice(choice: ToolChoice) -> Any:
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def response_format(output: OutputFormat) -> dict[str, Any]:
    if output.schema is None:
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": output.name, "schema": output.schema}
    if output.strict:
        spec["strict"] = True
    return {"type": "json_schema", "json_schema": spec}
