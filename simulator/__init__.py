"""The upstream simulator: a fake LLM provider, for development and tests only.

This is a development and test tool, never used on the request path: no
part of the gateway imports it, only the ``simulate_upstream`` management
command (which runs it as a process) and the tests. The test suite,
``bin/demo`` and the benchmark point their channels at it in place of
OpenAI, Anthropic and Google.

It sits at the far end of request -> auth -> channel choice -> *relay* ->
metering: the relay sends it real provider requests and gets back the exact
bytes OpenAI Chat, OpenAI Responses, Anthropic and Gemini would send, streaming
or not, and those of the clouds that resell them: Azure OpenAI, Amazon
Bedrock (SigV4-checked, AWS event streams) and Google Vertex AI (with its
own OAuth2 token endpoint). Misbehaviour is ordered per request with directives (status codes,
in-stream errors, stalls, cut connections, odd chunking, pacing), and every
request is recorded with the bytes it was answered with, so a test can check
what the gateway relayed against what the upstream really sent.

Its parts:

- ``server``: ``Simulator``, which routes requests, keeps the records and
  drives each answer (pacing, failures at token N), and ``run``;
- ``http``: the HTTP/1.1 server layer on plain ``asyncio.start_server``,
  with full control over chunk boundaries, pauses and how a connection ends;
- ``requests``: the ``[sim k=v]`` directives a request carries (the full
  list of keys is there) and its prompt words;
- ``records``: what is remembered of each request;
- ``wire``: the exact bytes of each protocol's events and bodies;
- ``clouds``: the clouds' routes, and ``cloud_auth`` how their credentials
  are checked (the key pair, API key and service-account key it accepts);
- ``eventstream``: AWS's binary event-stream encoder; ``embeddings``: the
  clouds' embedding answers.
"""

from simulator.cloud_auth import (
    SIM_AWS_ACCESS_KEY_ID,
    SIM_AWS_SECRET_ACCESS_KEY,
    SIM_BEDROCK_API_KEY,
    vertex_service_account,
)
from simulator.server import Simulator, run

__all__ = ["SIM_AWS_ACCESS_KEY_ID", "SIM_AWS_SECRET_ACCESS_KEY", "SIM_BEDROCK_API_KEY", "Simulator", "run",
           "vertex_service_account"]
