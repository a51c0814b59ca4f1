"""The clouds' official clients, pointed straight at an in-process simulator.

Shared by ``test_simulator_clouds``: boto3's ``bedrock-runtime`` client and
the anthropic SDK's ``AnthropicBedrock`` (SigV4 with the simulator's key
pair), ``AnthropicVertex`` and google-genai in Vertex mode (a service-account
key whose token_uri is the simulator's), and openai's ``AzureOpenAI``.
"""

from __future__ import annotations

from typing import Any

import anthropic
import boto3
import openai
from botocore.config import Config
from botocore.eventstream import EventStreamBuffer, EventStreamMessage
from google import genai
from google.genai import types as genai_types
from google.oauth2 import service_account

from simulator import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY, vertex_service_account
from tests.support.simulator_harness import Sim

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
AZURE_VERSION = "2024-10-21"
CLAUDE_PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"  # an inference profile, colon and all
NOVA = "us.amazon.nova-pro-v1:0"


def bedrock(sim: Sim, secret: str = SIM_AWS_SECRET_ACCESS_KEY, access_key: str = SIM_AWS_ACCESS_KEY_ID,
            session_token: str | None = None, read_timeout: float = 10.0) -> Any:
    """boto3's bedrock-runtime client; no retries, so each call is one request."""
    return boto3.client(
        "bedrock-runtime", endpoint_url=sim.base, region_name="eu-west-3", aws_access_key_id=access_key,
        aws_secret_access_key=secret, aws_session_token=session_token,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}, read_timeout=read_timeout,
                      connect_timeout=5))


def anthropic_bedrock(sim: Sim, **credentials: Any) -> anthropic.AnthropicBedrock:
    if not credentials:
        credentials = {"aws_access_key": SIM_AWS_ACCESS_KEY_ID, "aws_secret_key": SIM_AWS_SECRET_ACCESS_KEY}
    return anthropic.AnthropicBedrock(aws_region="us-west-2", base_url=sim.base, max_retries=0, **credentials)


def vertex_credentials(key: dict[str, Any]) -> service_account.Credentials:
    return service_account.Credentials.from_service_account_info(key, scopes=[CLOUD_PLATFORM])


def anthropic_vertex(sim: Sim, key: dict[str, Any] | None = None, access_token: str | None = None,
                     ) -> anthropic.AnthropicVertex:
    credentials = None if access_token else vertex_credentials(key or vertex_service_account(sim.base))
    return anthropic.AnthropicVertex(region="us-east5", project_id="hopbase-sim", base_url=f"{sim.base}/v1",
                                     credentials=credentials, access_token=access_token, max_retries=0)


def genai_vertex(sim: Sim, credentials: service_account.Credentials) -> genai.Client:
    return genai.Client(vertexai=True, project="hopbase-sim", location="europe-west4", credentials=credentials,
                        http_options=genai_types.HttpOptions(base_url=sim.base))


def azure(sim: Sim, api_key: str = "azure-key", timeout: float = 10.0) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(azure_endpoint=sim.base, api_key=api_key, api_version=AZURE_VERSION, max_retries=0,
                              timeout=timeout)


def frames(raw: bytes) -> list[EventStreamMessage]:
    """The event-stream messages in bytes the simulator sent, CRCs checked by botocore."""
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    return list(buffer)


def converse_messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": text}]}]


def bedrock_anthropic_body(text: str, max_tokens: int = 50) -> dict[str, Any]:
    return {"anthropic_version": "bedrock-2023-05-31", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}]}
