"""The demo's data (manage.py demo, run by bin/demo): a key that works with
the SDKs at once, failover to watch without any setup, and one channel of
each cloud kind on the simulator."""

from __future__ import annotations

import io
import re
import time

import anthropic
import openai
import pytest
from django.core.management import call_command

from billing.settlement import settle
from channels_pool.models import Channel
from hopbase.management.commands.demo import CLOUD_MODELS
from tests.support.protocol_checks import genai_client
from tests.support.wire import wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def test_the_demo_shows_failover_out_of_the_box(gateway, simulator):
    out = io.StringIO()
    call_command("demo", simulator_url=simulator.url, gateway_url=gateway.url, stdout=out)
    printed = out.getvalue()
    secret = re.search(r"\bhb-[\w-]+", printed).group(0)
    assert "failover-demo" in printed and "/admin/" in printed and "createsuperuser" in printed
    assert "HOPBASE_STALL_TIMEOUT=" in printed
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0)
    deadline = time.monotonic() + 10  # the gateway reads new channels within its config TTL
    while True:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="failover-demo", messages=[{"role": "user", "content": "hello"}]
            )
            break
        except openai.NotFoundError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert raw.parse().choices[0].message.content
    log = wait_for_log(raw.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.channel.name) == ("completed", 2, "demo-openai-steady")


def test_the_demo_serves_one_channel_of_each_cloud_kind(gateway, simulator):
    out = io.StringIO()
    call_command("demo", simulator_url=simulator.url, gateway_url=gateway.url, stdout=out)
    printed = out.getvalue()
    secret = re.search(r"\bhb-[\w-]+", printed).group(0)
    public_models = [public for models in CLOUD_MODELS.values() for public in models]
    assert all(f'"{model}"' in printed for model in public_models)
    # The demo's own (the test world has cloud channels of its own).
    channels = {c.protocol: c for c in Channel.objects.filter(protocol__in=CLOUD_MODELS, name__startswith="demo-")}
    assert set(channels) == {"azure", "bedrock", "vertex"}
    for channel in channels.values():
        channel.clean()  # as its kind checks it: region, project and location, the key's shape
    assert channels["bedrock"].region and channels["vertex"].project and channels["vertex"].location == "global"

    oai = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0, timeout=20)
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=20)
    gem = genai_client(gateway.url, secret)
    hello = [{"role": "user", "content": "hello [sim tokens=3]"}]

    def azure() -> tuple[str, str]:
        raw = oai.chat.completions.with_raw_response.create(model="azure-gpt-4o", messages=hello)
        return raw.parse().choices[0].message.content, raw.headers["x-hopbase-request-id"]

    def messages(model: str) -> tuple[str, str]:
        raw = claude.messages.with_raw_response.create(model=model, max_tokens=20, messages=hello)
        return raw.parse().content[0].text, raw.headers["x-hopbase-request-id"]

    def gemini() -> tuple[str, str]:
        answer = gem.models.generate_content(model="vertex-gemini", contents="hello [sim tokens=3]")
        return answer.text, answer.sdk_http_response.headers["x-hopbase-request-id"]

    def embed(model: str) -> tuple[str, str]:
        raw = oai.embeddings.with_raw_response.create(model=model, input=["hello", "world"])
        vectors = [item.embedding for item in raw.parse().data]
        return f"{len(vectors)} vectors" if len(vectors) == 2 and vectors[0] != vectors[1] else "", \
            raw.headers["x-hopbase-request-id"]

    calls = {"azure-gpt-4o": ("demo-azure", azure),
             "bedrock-titan-embed": ("demo-bedrock", lambda: embed("bedrock-titan-embed")),
             "vertex-embedding": ("demo-vertex", lambda: embed("vertex-embedding")),
             "bedrock-claude": ("demo-bedrock", lambda: messages("bedrock-claude")),
             "bedrock-nova": ("demo-bedrock", lambda: messages("bedrock-nova")),
             "vertex-claude": ("demo-vertex", lambda: messages("vertex-claude")),
             "vertex-gemini": ("demo-vertex", gemini)}
    assert set(calls) == set(public_models)
    deadline = time.monotonic() + 10  # the gateway reads new channels within its config TTL
    while True:
        try:
            answers = {model: call() for model, (_, call) in calls.items()}
            break
        except (openai.NotFoundError, anthropic.NotFoundError):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    for model, (text, request_id) in answers.items():
        assert text, model
        log = wait_for_log(request_id)
        assert (log.status, log.channel.name, log.model) == ("completed", calls[model][0], model)
        settle(log.pk)  # as the Celery worker would (none runs beside this gateway)
        log.refresh_from_db()
        assert log.charge_usd > 0
