"""Set up a demo tenant, key, prices and channels on the built-in simulator,
then print the key and SDK snippets (used by bin/demo)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from billing.ledger import top_up
from billing.models import ModelPrice
from channels_pool.models import Channel
from simulator import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY, vertex_service_account
from tenants.models import ApiKey, Tenant

DEMO_MODELS = {
    "openai": ["gpt-4o-mini", "gpt-4.1", "text-embedding-3-small"],
    "anthropic": ["claude-sonnet-5-5", "claude-haiku-5-5"],
    "gemini": ["gemini-2.5-flash"],
}
# Served first by an Anthropic channel that always answers 529 (its key
# tells the simulator so), then by a healthy channel of each protocol:
# failover, across protocols for the OpenAI and Gemini SDKs, out of the box.
FAILOVER_MODEL = "failover-demo"
FLAKY_PROTOCOL = "anthropic"
# One channel of each cloud kind, on the same simulator, each written as an
# operator would write it for the real cloud: public=upstream where the
# upstream name is the cloud's own (Azure's deployment, Bedrock's inference
# profile, Vertex's versioned Claude id). On Bedrock, an Anthropic model
# (its events pass through to a Messages client) and one that speaks
# Converse (translated for every client).
AZURE_DEPLOYMENT = "demo-gpt-4o"
BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
BEDROCK_CONVERSE_MODEL = "amazon.nova-pro-v1:0"
BEDROCK_EMBEDDING_MODEL = "amazon.titan-embed-text-v2:0"
BEDROCK_REGION = "us-east-1"
VERTEX_PROJECT = "hopbase-sim"
VERTEX_LOCATION = "global"
VERTEX_GEMINI = "gemini-2.5-flash"
VERTEX_CLAUDE = "claude-sonnet-4-5@20250929"
VERTEX_EMBEDDING = "text-embedding-005"
CLOUD_MODELS = {
    "azure": {"azure-gpt-4o": AZURE_DEPLOYMENT},
    "bedrock": {"bedrock-claude": BEDROCK_MODEL, "bedrock-nova": BEDROCK_CONVERSE_MODEL,
                "bedrock-titan-embed": BEDROCK_EMBEDDING_MODEL},
    "vertex": {"vertex-gemini": VERTEX_GEMINI, "vertex-claude": VERTEX_CLAUDE, "vertex-embedding": VERTEX_EMBEDDING},
}
DEMO_PRICE = {"input": Decimal("1.00"), "output": Decimal("4.00"), "read": Decimal("0.10"), "write": Decimal("1.25")}

SNIPPET = """
HopBase is ready at {gateway}. Your demo key (shown once):

{secret}

OpenAI SDK:
    from openai import OpenAI
    client = OpenAI(base_url="{gateway}/v1", api_key="{secret}")
    print(client.chat.completions.create(model="gpt-4o-mini",
          messages=[{{"role": "user", "content": "Hello"}}]).choices[0].message.content)

Anthropic SDK:
    from anthropic import Anthropic
    client = Anthropic(base_url="{gateway}", api_key="{secret}")
    with client.messages.stream(model="claude-sonnet-5-5", max_tokens=256,
                                messages=[{{"role": "user", "content": "Hello"}}]) as stream:
        for text in stream.text_stream:
            print(text, end="", flush=True)

Google GenAI SDK:
    from google import genai
    client = genai.Client(api_key="{secret}", http_options={{"base_url": "{gateway}", "api_version": "v1beta"}})
    print(client.models.generate_content(model="gemini-2.5-flash", contents="Hello").text)

Any SDK reaches any model: ask the OpenAI SDK for "claude-sonnet-5-5" (an
Anthropic channel, translated both ways) or the Anthropic SDK for
"gpt-4o-mini".

Embeddings: client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
with the OpenAI SDK, or client.models.embed_content(model="text-embedding-3-small",
contents=["a", "b"]) with the Google GenAI SDK.

Cloud channels, one of each kind on the same simulator (any SDK reaches
each of them, as above):
    "azure-gpt-4o"    Azure OpenAI, deployment {azure_deployment} (api-key, default api-version)
    "bedrock-claude"  Amazon Bedrock, {bedrock_model} in {bedrock_region}
                      (SigV4 with an access key pair, answers in AWS's event stream)
    "bedrock-nova"    Amazon Bedrock, {bedrock_converse_model} (the Converse API, translated)
    "vertex-gemini"   Vertex AI, {vertex_gemini} in {vertex_location} (a service-account key)
    "vertex-claude"   Vertex AI, {vertex_claude} (the same key)
    "bedrock-titan-embed", "vertex-embedding"   embeddings on Bedrock (Titan) and Vertex (:predict)
e.g. the Anthropic SDK above with model="bedrock-claude" or "vertex-claude".

Watch failover: ask for model "{failover}" with any SDK. Its first channel
(Anthropic) always answers 529; HopBase moves to the next before anything
reaches you, translating if it must,
and after a few failures the breaker skips the bad channel for a while. The
admin shows both: each request log's attempts and channel, and the
channels' health.

Make a request misbehave with a directive in the prompt: "[sim status=529]"
(every channel fails: you get an ordinary error in your SDK's format),
"[sim cut_after=3]", "[sim stall_after=2]", "[sim first_delay=3]",
"[sim tokens=200 pace=0.05]". The stall timeout is 180 s by default: to try
faults quickly, start with short timers, e.g.
    HOPBASE_STALL_TIMEOUT=5 HOPBASE_KEEPALIVE_INTERVAL=2 HOPBASE_HOLD_MAX=5 bin/demo

Operators: create a login, then open {gateway}/admin/ (tenants, keys,
channels and their health, prices, request logs, the ledger) and the
dashboard at {gateway}/admin/dashboard/ (bin/demo keeps its SECRET_KEY in
var/demo-secret-key; commands need it too):
    SECRET_KEY=$(cat var/demo-secret-key) .venv/bin/python manage.py createsuperuser
Metrics: {gateway}/metrics   Readiness: {gateway}/readyz
"""


class Command(BaseCommand):
    help = "Create (or refresh) the demo tenant, a new key, prices and simulator channels."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--simulator-url", default="http://127.0.0.1:8901")
        parser.add_argument("--gateway-url", default="http://127.0.0.1:8000")

    @transaction.atomic
    def handle(self, *args, simulator_url: str, gateway_url: str, **options) -> None:
        simulator_url = simulator_url.rstrip("/")
        tenant, created = Tenant.objects.get_or_create(name="demo")
        if created:
            top_up(tenant, Decimal("100"), note="demo credit")
        for protocol, models in DEMO_MODELS.items():
            base_url = simulator_url + "/v1" if protocol == "openai" else simulator_url
            Channel.objects.update_or_create(
                name=f"demo-{protocol}",
                defaults={"protocol": protocol, "base_url": base_url, "secret": "sk-simulated", "served_models": models},
            )
            if protocol == FLAKY_PROTOCOL:
                Channel.objects.update_or_create(
                    name=f"demo-{protocol}-flaky",
                    defaults={
                        "protocol": protocol, "base_url": base_url, "secret": "sim:status=529",
                        "served_models": [FAILOVER_MODEL], "priority": 10,
                    },
                )
            else:
                # A demo set up before translation had one of these per protocol.
                Channel.objects.filter(name=f"demo-{protocol}-flaky").delete()
            Channel.objects.update_or_create(
                name=f"demo-{protocol}-steady",
                defaults={"protocol": protocol, "base_url": base_url, "secret": "sk-simulated", "served_models": [FAILOVER_MODEL]},
            )
        for kind, defaults in cloud_channels(simulator_url).items():
            Channel.objects.update_or_create(name=f"demo-{kind}", defaults=defaults)
        cloud_models = (public for models in CLOUD_MODELS.values() for public in models)
        for model in {FAILOVER_MODEL, *cloud_models, *(m for models in DEMO_MODELS.values() for m in models)}:
            if not ModelPrice.objects.filter(model=model).exists():
                ModelPrice.objects.create(
                    model=model,
                    input_usd_per_mtok=DEMO_PRICE["input"],
                    output_usd_per_mtok=DEMO_PRICE["output"],
                    cache_read_usd_per_mtok=DEMO_PRICE["read"],
                    cache_write_usd_per_mtok=DEMO_PRICE["write"],
                )
        _, secret = ApiKey.objects.issue(tenant, label="demo")
        self.stdout.write(SNIPPET.format(
            gateway=gateway_url.rstrip("/"), secret=secret, failover=FAILOVER_MODEL,
            azure_deployment=AZURE_DEPLOYMENT, bedrock_model=BEDROCK_MODEL, bedrock_region=BEDROCK_REGION,
            bedrock_converse_model=BEDROCK_CONVERSE_MODEL,
            vertex_gemini=VERTEX_GEMINI, vertex_claude=VERTEX_CLAUDE, vertex_location=VERTEX_LOCATION,
        ))


def cloud_channels(simulator_url: str) -> dict[str, dict[str, Any]]:
    """Each cloud kind's demo channel (its fields), on the simulator at simulator_url.

    The credentials are the ones the simulator accepts: any Azure key, its
    AWS key pair, and its service-account key, whose token_uri is the
    simulator's own token endpoint.
    """
    def served(kind: str) -> list[str]:
        return [f"{public}={upstream}" for public, upstream in CLOUD_MODELS[kind].items()]

    return {
        "azure": {"protocol": "azure", "base_url": simulator_url, "secret": "azure-simulated",
                  "served_models": served("azure")},
        "bedrock": {"protocol": "bedrock", "base_url": simulator_url, "region": BEDROCK_REGION,
                    "secret": f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}",
                    "served_models": served("bedrock")},
        "vertex": {"protocol": "vertex", "base_url": simulator_url, "project": VERTEX_PROJECT,
                   "location": VERTEX_LOCATION, "secret": json.dumps(vertex_service_account(simulator_url)),
                   "served_models": served("vertex")},
    }
