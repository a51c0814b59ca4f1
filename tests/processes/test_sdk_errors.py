"""What a user of each official SDK sees when things go wrong (F6, M2–M6):
failures before the first token are ordinary HTTP errors the SDK retries or
raises by status; failures after it raise while the user iterates."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.relay_checks import new_tag

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)

GENERIC = "The model provider returned an error. Please retry."


@pytest.fixture
def oai(gateway, world):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=world.key, max_retries=0)


@pytest.fixture
def claude(gateway, world):
    return anthropic.Anthropic(base_url=gateway.url, api_key=world.key, max_retries=0)


@pytest.fixture
def gemini(gateway, world):
    return genai.Client(api_key=world.key, http_options=types.HttpOptions(base_url=gateway.url, api_version="v1beta"))


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- mid-stream (M3, M4) -----------------------------------------------------------


def test_openai_chat_raises_api_error_while_iterating(oai):
    stream = oai.chat.completions.create(model="sim-model", stream=True, messages=user("hi [sim tokens=6 error_after=2 error_kind=overloaded]"))
    texts = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "")
    assert not isinstance(raised.value, openai.APIStatusError)
    assert raised.value.code == "rate_limit_exceeded"
    assert raised.value.message == GENERIC
    assert "".join(texts).startswith("héllo")


def test_openai_responses_raises_on_the_error_event(oai):
    with pytest.raises(openai.APIError) as raised:
        with oai.responses.stream(model="sim-model", input="hi [sim tokens=6 error_after=2]") as stream:
            for _ in stream:
                pass
    assert raised.value.message == GENERIC


def test_anthropic_raises_a_status_error_with_the_error_type(claude):
    with pytest.raises(anthropic.APIStatusError) as raised:
        with claude.messages.stream(model="sim-model", max_tokens=100, messages=user("hi [sim tokens=6 error_after=2 error_kind=overloaded]")) as stream:
            for _ in stream.text_stream:
                pass
    assert raised.value.body["error"]["type"] == "overloaded_error"
    assert raised.value.body["error"]["message"] == GENERIC


def test_anthropic_cut_stream_raises_the_interruption(claude):
    with pytest.raises(anthropic.APIStatusError) as raised:
        with claude.messages.stream(model="sim-model", max_tokens=100, messages=user("hi [sim tokens=8 cut_after=3]")) as stream:
            for _ in stream.text_stream:
                pass
    assert raised.value.body["error"] == {"type": "api_error", "message": "Response stream interrupted, please retry"}


def test_gemini_raises_with_an_integer_code(gemini):
    with pytest.raises(genai_errors.ServerError) as raised:
        for _ in gemini.models.generate_content_stream(model="sim-model", contents="hi [sim tokens=6 stall_after=2]"):
            pass
    assert raised.value.code == 503
    assert raised.value.status == "UNAVAILABLE"


def test_gemini_busy_mid_stream_is_a_client_error_429(gemini):
    with pytest.raises(genai_errors.ClientError) as raised:
        for _ in gemini.models.generate_content_stream(model="sim-model", contents="hi [sim tokens=6 error_after=2 error_kind=overloaded]"):
            pass
    assert raised.value.code == 429


# -- before the first token, every channel failed (F6) ------------------------------


def test_openai_gets_a_rate_limit_error_it_can_retry(oai):
    with pytest.raises(openai.RateLimitError) as raised:
        oai.chat.completions.create(model="all-busy", messages=user("hi"))
    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"


def test_openai_retries_an_all_busy_answer_by_itself(gateway, world, sim_records):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=world.key, max_retries=1)
    tag = new_tag()  # each server's run counts its own
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="all-busy", messages=user(f"hi [sim tag={tag}]"))
    assert len(sim_records(tag)) == 4  # two channels, tried twice


def test_anthropic_gets_an_overloaded_error(claude):
    with pytest.raises(anthropic.OverloadedError) as raised:
        claude.messages.create(model="all-busy", max_tokens=50, messages=user("hi"))
    assert raised.value.status_code == 529


def test_anthropic_gets_an_internal_server_error_when_channels_are_down(claude):
    with pytest.raises(anthropic.InternalServerError) as raised:
        claude.messages.create(model="all-down", max_tokens=50, messages=user("hi"))
    assert raised.value.body["error"]["type"] == "api_error"


def test_gemini_gets_unavailable_when_channels_are_down(gemini):
    with pytest.raises(genai_errors.ServerError) as raised:
        gemini.models.generate_content(model="all-down", contents="hi")
    assert (raised.value.code, raised.value.status) == (503, "UNAVAILABLE")


def test_an_early_failure_is_invisible_to_every_sdk(oai, claude, gemini):
    assert oai.chat.completions.create(model="failover-event", messages=user("hi")).choices[0].message.content
    assert claude.messages.create(model="failover-busy", max_tokens=50, messages=user("hi")).content[0].text
    assert gemini.models.generate_content(model="failover-key", contents="hi").text
