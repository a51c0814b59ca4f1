"""Fixtures: the official SDKs as clients, of the gateway (with the test
key) and of the simulator directly (to compare with what a provider says).
A pytest plugin, loaded by conftest.py."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai

from tests.support.protocol_checks import DIRECT_KEY, anthropic_client, genai_client, openai_client


@pytest.fixture
def oai(gateway, world) -> openai.OpenAI:
    return openai_client(gateway, world.key)


@pytest.fixture
def direct_oai(simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{simulator.url}/v1", api_key=DIRECT_KEY, max_retries=0, timeout=20)


@pytest.fixture
def claude(gateway, world) -> anthropic.Anthropic:
    return anthropic_client(gateway, world.key)


@pytest.fixture
def direct_claude(simulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=simulator.url, api_key=DIRECT_KEY, max_retries=0, timeout=20)


@pytest.fixture
def gem(gateway, world) -> genai.Client:
    return genai_client(gateway.url, world.key)


@pytest.fixture
def direct_gem(simulator) -> genai.Client:
    return genai_client(simulator.url, DIRECT_KEY)
