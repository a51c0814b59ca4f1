"""The upstream simulator: a fake LLM provider, for development and tests only.

This is a development and test tool, never used on the request path: no
part of the gateway imports it, only the ``simulate_upstream`` management
command (which runs it as a process) and the tests. The test suite,
``bin/demo`` and the benchmark point their channels at it in place of
OpenAI, Anthropic and Google.

It sits at the far end of request -> auth -> channel choice -> *relay* ->
metering: the relay sends it real provider requests and gets back the exact
bytes OpenAI Chat, OpenAI Responses, Anthropic and Gemini would send, streaming
or not. Misbehaviour is ordered per request with directives (status codes,
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
- ``wire``: the exact bytes of each protocol's events and bodies.
"""

from channels_pool.simulator.server import Simulator, run

__all__ = ["Simulator", "run"]
