"""Each client API through its official SDK, its answer reduced to what every
API can say: text, thinking, tool calls, how it stopped, usage, and the
request id HopBase gave it. Used by tests/processes/test_translation_gateway.py to ask
the same of every pair of client API and channel protocol."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import anthropic
import httpx
import openai
from google.genai import types

from tests.support.protocol_checks import (
    TOOL_NAME,
    WEATHER_TOOL_ANTHROPIC,
    WEATHER_TOOL_OPENAI,
    RequestIds,
    anthropic_client,
    genai_client,
    openai_client,
)

CLIENT_APIS = ("chat", "responses", "messages", "gemini")
CHANNEL_PROTOCOLS = ("openai", "anthropic", "gemini")
# The protocol each client API passes through to unchanged.
NATIVE = {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gemini"}


@dataclass
class Answer:
    text: str = ""
    thinking: str = ""
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)
    stop: str = ""  # "end", "tool" or "length"
    input_tokens: int = 0  # all of the prompt, cached or not
    output_tokens: int = 0  # thinking included
    model: str = ""
    request_id: str | None = None


def ask(gateway, key: str, api: str, model: str, text: str, *, stream: bool, tool: bool = False,
        thinking: bool = False, max_tokens: int = 256) -> Answer:
    return ASK[api](gateway, key, model, text, stream, tool, thinking, max_tokens)


def count_tokens(gateway, key: str, api: str, model: str, text: str) -> tuple[httpx.Response, int]:
    """Anthropic's count_tokens (``api`` "messages") or Gemini's countTokens
    for one user turn of ``text``: the answer, and the count in it."""
    if api == "messages":
        response = httpx.post(f"{gateway.url}/v1/messages/count_tokens", timeout=20,
                              headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                              json={"model": model, "messages": [{"role": "user", "content": text}]})
        return response, response.json()["input_tokens"]
    response = httpx.post(f"{gateway.url}/v1beta/models/{model}:countTokens", timeout=20,
                          headers={"x-goog-api-key": key},
                          json={"contents": [{"role": "user", "parts": [{"text": text}]}]})
    return response, response.json()["totalTokens"]


def _chat(gateway, key, model, text, stream, tool, thinking, max_tokens) -> Answer:
    ids = RequestIds()
    client = openai_client(gateway, key, http_client=openai.DefaultHttpxClient(event_hooks={"response": [ids]}))
    kwargs: dict = {"model": model, "messages": [{"role": "user", "content": text}], "max_completion_tokens": max_tokens}
    if tool:
        kwargs["tools"] = [WEATHER_TOOL_OPENAI]
    if thinking:
        kwargs["reasoning_effort"] = "low"
    answer = Answer()
    if stream:
        calls: dict[int, list] = {}
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            answer.model = chunk.model
            if chunk.usage:
                answer.input_tokens, answer.output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
            for choice in chunk.choices:
                delta = choice.delta
                answer.text += delta.content or ""
                answer.thinking += (delta.model_extra or {}).get("reasoning_content") or ""
                for call in delta.tool_calls or ():
                    slot = calls.setdefault(call.index, ["", ""])
                    slot[0] += call.function.name or "" if call.function else ""
                    slot[1] += call.function.arguments or "" if call.function else ""
                if choice.finish_reason:
                    answer.stop = {"stop": "end", "tool_calls": "tool", "length": "length"}[choice.finish_reason]
        answer.tool_calls = [(name, json.loads(args)) for name, args in (calls[i] for i in sorted(calls))]
    else:
        completion = client.chat.completions.create(**kwargs)
        message, choice = completion.choices[0].message, completion.choices[0]
        answer.model, answer.text = completion.model, message.content or ""
        answer.thinking = (message.model_extra or {}).get("reasoning_content") or ""
        answer.tool_calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
        answer.stop = {"stop": "end", "tool_calls": "tool", "length": "length"}[choice.finish_reason]
        answer.input_tokens, answer.output_tokens = completion.usage.prompt_tokens, completion.usage.completion_tokens
    answer.request_id = ids.only
    return answer


def _responses(gateway, key, model, text, stream, tool, thinking, max_tokens) -> Answer:
    ids = RequestIds()
    client = openai_client(gateway, key, http_client=openai.DefaultHttpxClient(event_hooks={"response": [ids]}))
    kwargs: dict = {"model": model, "input": text, "max_output_tokens": max_tokens}
    if tool:
        function = WEATHER_TOOL_OPENAI["function"]
        kwargs["tools"] = [{"type": "function", "name": TOOL_NAME, "description": function["description"],
                            "parameters": function["parameters"], "strict": False}]
    if thinking:
        kwargs["reasoning"] = {"effort": "low", "summary": "auto"}
    if stream:
        with client.responses.stream(**kwargs) as events:
            for _ in events:
                pass
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    answer = Answer(model=response.model, request_id=ids.only)
    for item in response.output:
        if item.type == "message":
            answer.text += "".join(part.text for part in item.content if part.type == "output_text")
        elif item.type == "reasoning":
            answer.thinking += "".join(part.text for part in item.summary)
        elif item.type == "function_call":
            answer.tool_calls.append((item.name, json.loads(item.arguments)))
    if response.status == "incomplete":
        answer.stop = "length"
    else:
        answer.stop = "tool" if answer.tool_calls else "end"
    answer.input_tokens, answer.output_tokens = response.usage.input_tokens, response.usage.output_tokens
    return answer


def _messages(gateway, key, model, text, stream, tool, thinking, max_tokens) -> Answer:
    ids = RequestIds()
    client = anthropic_client(gateway, key, http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [ids]}))
    kwargs: dict = {"model": model, "max_tokens": max_tokens + 2048 * thinking,
                    "messages": [{"role": "user", "content": text}]}
    if tool:
        kwargs["tools"] = [WEATHER_TOOL_ANTHROPIC]
    if thinking:
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    if stream:
        with client.messages.stream(**kwargs) as events:
            for _ in events:
                pass
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    answer = Answer(model=message.model, request_id=ids.only)
    for block in message.content:
        if block.type == "text":
            answer.text += block.text
        elif block.type == "thinking":
            answer.thinking += block.thinking
        elif block.type == "tool_use":
            answer.tool_calls.append((block.name, block.input))
    answer.stop = {"end_turn": "end", "tool_use": "tool", "max_tokens": "length"}[message.stop_reason]
    usage = message.usage
    answer.input_tokens = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0)
    answer.output_tokens = usage.output_tokens
    return answer


def _gemini(gateway, key, model, text, stream, tool, thinking, max_tokens) -> Answer:
    client = genai_client(gateway.url, key)
    config: dict = {"max_output_tokens": max_tokens}
    if tool:
        function = WEATHER_TOOL_OPENAI["function"]
        config["tools"] = [types.Tool(function_declarations=[types.FunctionDeclaration(
            name=TOOL_NAME, description=function["description"], parameters_json_schema=function["parameters"])])]
        config["automatic_function_calling"] = types.AutomaticFunctionCallingConfig(disable=True)
    if thinking:
        config["thinking_config"] = types.ThinkingConfig(thinking_budget=2048, include_thoughts=True)
    generate = client.models.generate_content_stream if stream else client.models.generate_content
    responses = generate(model=model, contents=text, config=types.GenerateContentConfig(**config))
    chunks = list(responses) if stream else [responses]
    headers = (chunks[0].sdk_http_response.headers if chunks and chunks[0].sdk_http_response else None) or {}
    answer = Answer(request_id={k.lower(): v for k, v in headers.items()}.get("x-hopbase-request-id"))
    for chunk in chunks:
        answer.model = chunk.model_version or answer.model
        for candidate in chunk.candidates or ():
            for part in (candidate.content.parts if candidate.content else None) or ():
                if part.function_call:
                    answer.tool_calls.append((part.function_call.name, dict(part.function_call.args or {})))
                elif part.thought:
                    answer.thinking += part.text or ""
                elif part.text:
                    answer.text += part.text
            if candidate.finish_reason:
                answer.stop = "length" if candidate.finish_reason == types.FinishReason.MAX_TOKENS else "end"
        if chunk.usage_metadata and chunk.usage_metadata.prompt_token_count is not None:
            usage = chunk.usage_metadata
            answer.input_tokens = usage.prompt_token_count
            answer.output_tokens = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
    if answer.tool_calls and answer.stop == "end":
        answer.stop = "tool"
    return answer


ASK = {"chat": _chat, "responses": _responses, "messages": _messages, "gemini": _gemini}
