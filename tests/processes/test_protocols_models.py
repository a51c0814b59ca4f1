"""Model lists and lookups, through each SDK (P5).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from channels_pool.models import Channel
from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import anthropic_client, genai_client, openai_client

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




# --------------------------------------------------------------------------- model lists (P5)


def served_models() -> list[str]:
    """Every public model name an enabled channel serves, whatever its
    protocol (T1: any API reaches any channel): what a key for every model
    may list, on every API."""
    names = {m for c in Channel.objects.enabled() for m in c.model_map()}
    assert {"sim-model", "claude-sim", "via-openai", "via-anthropic", "via-gemini"} <= names
    return sorted(names)


def test_it_lists_models_for_openai(oai, gateway, world, committed_db):
    raw = oai.models.with_raw_response.list()
    page = raw.parse()
    assert raw.headers["x-hopbase-request-id"].startswith("req_")
    assert [m.id for m in page.data] == served_models()
    assert {m.object for m in page.data} == {"model"}

    limited = openai_client(gateway, world.limited_key).models.list()
    assert [m.id for m in limited.data] == ["sim-model"]


def test_it_lists_models_for_anthropic(claude, gateway, world, committed_db):
    raw = claude.models.with_raw_response.list()
    page = raw.parse()
    assert raw.headers["x-hopbase-request-id"].startswith("req_")
    assert [m.id for m in page.data] == served_models()
    assert {m.type for m in page.data} == {"model"}
    assert page.has_more is False

    limited = anthropic_client(gateway, world.limited_key).models.list()
    assert [m.id for m in limited.data] == ["sim-model"]


@pytest.mark.parametrize("api_version", ["v1beta", "v1"])
def test_it_lists_models_for_gemini(gateway, world, committed_db, api_version):
    # Keep each client referenced: a collected genai client closes its transport.
    client = genai_client(gateway.url, world.key, api_version)
    assert [m.name for m in client.models.list()] == [f"models/{m}" for m in served_models()]

    limited = genai_client(gateway.url, world.limited_key, api_version)
    assert [m.name for m in limited.models.list()] == ["models/sim-model"]


def test_each_sdk_looks_up_one_model_it_may_use(oai, claude, gateway, world, committed_db):
    assert oai.models.retrieve("sim-model").id == "sim-model"
    assert claude.models.retrieve("sim-model").id == "sim-model"
    client = genai_client(gateway.url, world.key)
    assert client.models.get(model="sim-model").name == "models/sim-model"
    with pytest.raises(openai.NotFoundError):
        openai_client(gateway, world.limited_key).models.retrieve("claude-sim")
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("no-such-model")
