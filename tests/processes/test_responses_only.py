"""Models an OpenAI channel serves on the Responses API alone (the
gpt-5-codex class refuses Chat Completions): marked by the operator, or
learnt from the provider's refusal, they are reached there by clients of
every API, translated, with the answer in the client's own format."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal

import anthropic
import httpx
import pytest

from billing.models import ModelPrice
from channels_pool.models import Channel
from tests.support.protocol_checks import new_tag
from tests.support.wire import call, records, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def codex_like(world, marked: bool) -> str:
    model = f"codex-like-{uuid.uuid4().hex[:8]}"
    ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("1"), output_usd_per_mtok=Decimal("2"))
    Channel.objects.create(name=model, protocol="openai", base_url=world.simulator.url + "/v1",
                           secret="sim:responses_only=1", served_models=[model],
                           responses_only=[model] if marked else [])
    return model


def answered(gateway, request) -> httpx.Response:
    """The first answer once the new channel is read (within the config TTL)."""
    deadline = time.monotonic() + 5
    while True:
        answer = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=20)
        if answer.status_code != 404 or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def text_of(api: str, body: dict) -> str:
    if api == "chat":
        return body["choices"][0]["message"]["content"]
    if api == "messages":
        return "".join(block.get("text", "") for block in body["content"])
    return "".join(part.get("text", "") for part in body["candidates"][0]["content"]["parts"])


@pytest.mark.parametrize("api", ["messages", "chat", "gemini"])
def test_a_model_marked_responses_only_is_reached_there_by_every_api(gateway, world, api):
    model, tag = codex_like(world, marked=True), new_tag()
    answer = answered(gateway, call(api, world.key, model, f"hello [sim tag={tag} tokens=5]", stream=False))
    assert answer.status_code == 200, answer.text
    assert text_of(api, answer.json()).strip()
    (record,) = records(world.simulator.url, tag)
    assert record["protocol"] == "responses" and record["model"] == model
    assert record["body"]["store"] is False and record["body"]["input"][-1]["role"] == "user"
    log = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (log.status, log.output_tokens, log.usage_estimated) == ("completed", 5, False)


def test_a_refusal_of_chat_completions_is_learnt_and_the_request_still_served(gateway, world):
    model = codex_like(world, marked=False)
    first, second = new_tag(), new_tag()
    answer = answered(gateway, call("messages", world.key, model, f"hi [sim tag={first} tokens=3]", stream=False))
    assert answer.status_code == 200, answer.text
    # Asked in Chat Completions, refused, asked again in Responses on the same channel.
    assert [r["protocol"] for r in records(world.simulator.url, first)] == ["chat", "responses"]
    log = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts) == ("completed", 2)
    answer = answered(gateway, call("messages", world.key, model, f"again [sim tag={second} tokens=3]",
                                    stream=False))
    assert answer.status_code == 200
    assert [r["protocol"] for r in records(world.simulator.url, second)] == ["responses"]  # learnt


def test_claude_code_shaped_streams_with_tools_reach_a_responses_only_model(gateway, world):
    model, tag = codex_like(world, marked=True), new_tag()
    client = anthropic.Anthropic(base_url=gateway.url, api_key=world.key, max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    deadline = time.monotonic() + 5
    while True:  # the new channel is read within the config TTL
        try:
            asked = [{"role": "user", "content": f"weather? [sim tag={tag} tool=1]"}]
            with client.messages.stream(model=model, max_tokens=256, tools=tools, system="Be brief.",
                                        messages=asked) as stream:
                final = stream.get_final_message()
            break
        except anthropic.NotFoundError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert final.stop_reason == "tool_use"
    (use,) = [block for block in final.content if block.type == "tool_use"]
    assert use.name and isinstance(use.input, dict)
    (record,) = records(world.simulator.url, tag)
    assert record["protocol"] == "responses"
    assert record["body"]["instructions"] == "Be brief."
    assert record["body"]["tools"][0] == {"type": "function", "name": "get_weather", "description": "Weather",
                                          "parameters": json.loads(json.dumps(tools[0]["input_schema"]))}


def test_a_conversation_with_tool_turns_is_written_as_responses_items():
    from providers.neutral import CannotServe, Conversation, Message, Text, ToolCall, ToolResult
    from providers.openai.responses_upstream import encode

    conversation = Conversation(model="m", messages=[
        Message("user", [Text("weather in Paris?")]),
        Message("assistant", [Text("Checking."), ToolCall("call_1", "get_weather", '{"city":"Paris"}')]),
        Message("user", [ToolResult("call_1", [Text("sunny")]), Text("and tomorrow?")]),
    ], system=["Be brief."], max_tokens=100)
    body = encode(conversation, "gpt-5-codex").body
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and tomorrow?"}]},
    ]
    assert (body["instructions"], body["max_output_tokens"], body["stream"], body["store"]) == (
        "Be brief.", 100, True, False)
    conversation.stop = ["END"]
    with pytest.raises(CannotServe) as refused:
        encode(conversation, "gpt-5-codex")
    assert refused.value.field == "stop"


def test_only_openais_own_words_about_the_model_make_it_responses_only():
    from core.errors import RESPONSES_ONLY
    from providers.apis import CHAT

    own = b'{"error": {"message": "This model is only supported in v1/responses and not in v1/chat/completions.", ' \
          b'"type": "invalid_request_error", "param": "model", "code": null}}'
    quoted = b'{"error": {"message": "Unrecognized request argument supplied: only supported in v1/responses", ' \
             b'"type": "invalid_request_error", "param": null, "code": null}}'
    assert CHAT.upstream_failure(400, own, None).kind == RESPONSES_ONLY
    assert CHAT.upstream_failure(400, quoted, None).kind != RESPONSES_ONLY  # a tenant's own field name
