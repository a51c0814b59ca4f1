"""The admin's channel page for every kind (rule C6): the form carries the
chosen kind's settings (region; project and location; API version) and the
page shows only those, other kinds' settings are cleared on save, the kind's
rules name the field at fault, and a stored key is said to be there, never
shown, and may be removed where the kind needs none (Bedrock).

"Test channel" (channels_pool.probe), as an action and as a button on a
channel's page: one small request to the channel through its kind, against
the upstream simulator, which speaks every cloud. The operator is told the
status, the latency and the provider's own words, with no piece of the
channel's credential in them; a test writes no request log and leaves the
channel's health alone; only staff who may change channels may run one.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils.html import escape

from billing.models import LedgerEntry, RequestLog
from channels_pool.masking import MASK, masked
from channels_pool.models import Channel, ChannelHealth
from simulator import (
    SIM_AWS_ACCESS_KEY_ID,
    SIM_AWS_SECRET_ACCESS_KEY,
    SIM_BEDROCK_API_KEY,
    vertex_service_account,
)
from tests.support.factories import make_channel
from tests.support.staff_checks import PASSWORD, create_staff, log_in, post

pytestmark = pytest.mark.django_db

NO_HEALTH_FORMS = {"health-TOTAL_FORMS": "0", "health-INITIAL_FORMS": "0", "health-MIN_NUM_FORMS": "0",
                   "health-MAX_NUM_FORMS": "1"}
FORM = {"priority": "0", "weight": "1", "max_concurrency": "", "enabled": "on", "cross_protocol": "on",
        **NO_HEALTH_FORMS}
SETTINGS = ("region", "project", "location", "api_version")
AWS_PAIR = f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}"
NOVA = "us.amazon.nova-pro-v1:0"
CLAUDE_PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def change_url(channel: Channel) -> str:
    return reverse("admin:channels_pool_channel_change", args=[channel.pk])


def button_url(channel: Channel) -> str:
    return reverse("admin:channels_pool_channel_test", args=[channel.pk])


def bedrock_channel(name: str = "bedrock-eu", **fields) -> Channel:
    fields = {"protocol": "bedrock", "base_url": "https://bedrock-runtime.eu-west-3.amazonaws.com",
              "region": "eu-west-3", "secret": AWS_PAIR, "served_models": [f"nova={NOVA}"], **fields}
    return make_channel(name, **fields)


def form_of(channel: Channel, **changes: str) -> dict[str, str]:
    """The channel's change form as the page posts it (the secret field blank: keep the stored one)."""
    data = {"name": channel.name, "protocol": channel.protocol, "base_url": channel.base_url,
            "served_models": ", ".join(channel.served_models), "secret": "", **FORM,
            **{name: getattr(channel, name) for name in SETTINGS}}
    return {**data, **changes}


def errors_of(response) -> dict[str, list[str]]:
    assert response.status_code == 200, "the form was accepted"
    return {field: list(messages) for field, messages in response.context["adminform"].form.errors.items()}


def kinds_script(page: str) -> dict:
    script = re.search(r'<script id="channel-kinds" type="application/json">(.*?)</script>', page, re.DOTALL)
    return json.loads(script[1])


# The form


def test_the_page_tells_its_script_which_settings_each_kind_shows(admin_client):
    page = admin_client.get(reverse("admin:channels_pool_channel_add")).content.decode()
    for name in SETTINGS:
        assert f'name="{name}"' in page
    assert 'name="clear_secret"' not in page  # nothing stored yet to remove
    assert kinds_script(page) == {
        "openai": {"settings": [], "keyless": False}, "anthropic": {"settings": [], "keyless": False},
        "gemini": {"settings": [], "keyless": False}, "azure": {"settings": ["api_version"], "keyless": False},
        "bedrock": {"settings": ["region"], "keyless": True},
        "vertex": {"settings": ["project", "location"], "keyless": False},
    }


def test_a_bedrock_channel_page_shows_its_region_and_that_a_key_is_stored_never_the_key(admin_client):
    secret = f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}:session-token-never-shown-0001"
    channel = bedrock_channel(secret=secret)
    page = admin_client.get(change_url(channel)).content.decode()
    assert re.search(r'<input type="text" name="region" value="eu-west-3"', page)
    assert "Stored: •••• set." in page
    assert 'name="clear_secret"' in page
    for piece in secret.split(":"):
        assert piece not in page
    keyless = bedrock_channel("bedrock-chain", secret="")
    assert "None stored." in admin_client.get(change_url(keyless)).content.decode()


def test_an_operator_adds_cloud_channels_with_their_settings(admin_client):
    add = reverse("admin:channels_pool_channel_add")
    response = admin_client.post(add, {**FORM, "name": "bedrock-eu", "protocol": "bedrock", "region": "eu-west-3",
                                       "base_url": "https://bedrock-runtime.eu-west-3.amazonaws.com",
                                       "served_models": f"nova={NOVA}", "secret": AWS_PAIR})
    assert response.status_code == 302
    response = admin_client.post(add, {**FORM, "name": "bedrock-chain", "protocol": "bedrock", "region": "us-east-1",
                                       "base_url": "https://bedrock-runtime.us-east-1.amazonaws.com",
                                       "served_models": NOVA, "secret": ""})
    assert response.status_code == 302
    response = admin_client.post(add, {**FORM, "name": "azure-eu", "protocol": "azure",
                                       "api_version": "2025-04-01-preview",
                                       "base_url": "https://hopbase-eu.openai.azure.com",
                                       "served_models": "gpt-4o=prod-gpt-4o", "secret": "azure-key-0123"})
    assert response.status_code == 302
    stored = {c.name: (c.protocol, c.secret, c.region, c.api_version) for c in Channel.objects.all()}
    assert stored == {"bedrock-eu": ("bedrock", AWS_PAIR, "eu-west-3", ""),
                      "bedrock-chain": ("bedrock", "", "us-east-1", ""),
                      "azure-eu": ("azure", "azure-key-0123", "", "2025-04-01-preview")}


def test_a_vertex_channel_takes_a_service_account_key_and_keeps_it_on_edit(admin_client):
    key = json.dumps(vertex_service_account("https://oauth2.googleapis.com", project_id="hopbase-prod"))
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), {
        **FORM, "name": "vertex-us", "protocol": "vertex", "project": "hopbase-prod", "location": "us-east5",
        "base_url": "https://us-east5-aiplatform.googleapis.com", "served_models": "gemini-2.0-flash", "secret": key})
    assert response.status_code == 302
    channel = Channel.objects.get()
    assert (channel.secret, channel.project, channel.location) == (key, "hopbase-prod", "us-east5")
    response = admin_client.post(change_url(channel), form_of(channel, priority="5"))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.secret, channel.priority) == (key, 5)


def test_a_stored_bedrock_key_can_be_removed(admin_client):
    channel = bedrock_channel()
    response = admin_client.post(change_url(channel), form_of(channel, clear_secret="on"))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.secret, channel.region) == ("", "eu-west-3")
    assert "None stored." in admin_client.get(change_url(channel)).content.decode()


def test_a_key_the_kind_needs_cannot_be_removed(admin_client):
    channel = make_channel("openai-1", secret="sk-still-needed-0001")
    errors = errors_of(admin_client.post(change_url(channel), form_of(channel, clear_secret="on")))
    assert errors == {"secret": ["An openai channel needs a key."]}
    channel.refresh_from_db()
    assert channel.secret == "sk-still-needed-0001"


def test_removing_the_key_and_typing_a_new_one_at_once_is_refused(admin_client):
    channel = bedrock_channel()
    errors = errors_of(admin_client.post(change_url(channel),
                                         form_of(channel, clear_secret="on", secret="ABSK-a-new-key-0001")))
    assert list(errors) == ["clear_secret"]
    channel.refresh_from_db()
    assert channel.secret == AWS_PAIR


def test_settings_of_another_kind_are_cleared_on_save(admin_client):
    channel = bedrock_channel()
    # The kind changed to Azure: the region row was hidden, but still posted, and so were the others.
    response = admin_client.post(change_url(channel), form_of(
        channel, protocol="azure", served_models="gpt-4o=prod-gpt-4o", region="eu-west-3", project="hopbase-prod",
        location="us-east5", api_version="2024-06-01"))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.protocol == "azure"
    assert channel.settings() == {"region": "", "project": "", "location": "", "api_version": "2024-06-01"}
    assert channel.secret == AWS_PAIR  # a blank key field keeps the stored key, whatever the kind


def test_a_hidden_setting_of_another_kind_never_blocks_the_save(admin_client):
    channel = make_channel("openai-1", base_url="http://127.0.0.1:9/v1")
    too_long = "x" * 41  # longer than the location field takes, but in a row the page hid
    response = admin_client.post(change_url(channel), form_of(channel, location=too_long, priority="7"))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.location, channel.priority) == ("", 7)


@pytest.mark.parametrize(
    ("kind", "fields", "field", "words"),
    [
        ("bedrock", {"region": ""}, "region", "needs --region"),
        ("bedrock", {"region": "eu west 3"}, "region", "is not an AWS region"),
        ("bedrock", {"region": "eu-west-3", "secret": "AKIAHALFAPAIR0001:"}, "secret", "a bedrock key pair is"),
        ("vertex", {"location": "us-east5", "secret": "{}"}, "project", "needs --project"),
        ("vertex", {"project": "hopbase-prod", "location": "us east5", "secret": "{}"}, "location",
         "is not a Google Cloud location"),
        ("vertex", {"project": "hopbase-prod", "location": "us-east5", "secret": "not-a-json-key-0001"}, "secret",
         "a vertex key must be a service-account JSON key"),
        ("azure", {"api_version": "2024/10/21", "secret": "azure-key-0001"}, "api_version", "is not an API version"),
    ],
)
def test_a_kinds_rules_name_the_field_at_fault(admin_client, kind, fields, field, words):
    data = {**FORM, "name": "cloud-1", "protocol": kind, "base_url": "https://cloud.example.com",
            "served_models": "m1", "secret": "", **fields}
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), data)
    errors = errors_of(response)
    assert list(errors) == [field] and words in errors[field][0]
    assert not Channel.objects.exists()
    page = response.content.decode()
    for typed in ("AKIAHALFAPAIR0001", "not-a-json-key-0001", "azure-key-0001"):
        assert typed not in page


# Test channel


def shown_messages(response) -> list[tuple[str, str]]:
    """The admin messages a test left for the operator, (level, text), as
    the page they are sent back to shows them."""
    assert response.status_code == 302
    page = response.client.get(response["Location"])
    found = [(message.level_tag, message.message) for message in page.context["messages"]]
    assert all(escape(text) in page.content.decode() for _, text in found)
    return found


def press_test(client, channel: Channel) -> tuple[str, str]:
    """The change page's "Test channel" button: back to the page, with one message."""
    response = client.post(button_url(channel))
    assert response["Location"] == change_url(channel)
    [message] = shown_messages(response)
    return message


def vertex_key(simulator, directives: str = "") -> str:
    return json.dumps(vertex_service_account(simulator.url, directives))


# Every kind, and each cloud's grammars: (kind, secret, served model, settings).
def working(simulator) -> dict[str, tuple[str, str, str, dict[str, str]]]:
    return {
        "openai": ("openai", "sk-working-0001", "gpt-probe", {}),
        "anthropic": ("anthropic", "sk-ant-working-0001", "claude-probe", {}),
        "gemini": ("gemini", "AIza-working-0001", "gemini-probe", {}),
        "azure": ("azure", "azure-key-working-0001", "gpt-4o=prod-gpt-4o", {"api_version": "2024-10-21"}),
        "bedrock-converse": ("bedrock", AWS_PAIR, f"nova={NOVA}", {"region": "eu-west-3"}),
        "bedrock-anthropic": ("bedrock", AWS_PAIR, f"claude={CLAUDE_PROFILE}", {"region": "us-west-2"}),
        "bedrock-api-key": ("bedrock", SIM_BEDROCK_API_KEY, NOVA, {"region": "us-east-1"}),
        "vertex-gemini": ("vertex", vertex_key(simulator), "gemini-2.0-flash",
                          {"project": "hopbase-sim", "location": "europe-west4"}),
        "vertex-claude": ("vertex", vertex_key(simulator), "claude-sonnet-4-5@20250929",
                          {"project": "hopbase-sim", "location": "us-east5"}),
        # Models served for embeddings are tested with an embeddings request.
        "openai-embeddings": ("openai", "sk-working-0001", "text-embedding-3-small", {}),
        "gemini-embeddings": ("gemini", "AIza-working-0001", "gemini-embedding-001", {}),
        "vertex-embeddings": ("vertex", vertex_key(simulator), "text-embedding-005",
                              {"project": "hopbase-sim", "location": "us-central1"}),
        "bedrock-titan": ("bedrock", AWS_PAIR, "amazon.titan-embed-text-v2:0", {"region": "us-east-1"}),
        "bedrock-cohere": ("bedrock", AWS_PAIR, "cohere.embed-english-v3", {"region": "us-east-1"}),
    }


def sim_channel(simulator, name: str, kind: str, secret: str, model: str, fields: dict[str, str]) -> Channel:
    base_url = simulator.url + "/v1" if kind == "openai" else simulator.url
    return Channel.objects.create(name=name, protocol=kind, base_url=base_url, secret=secret, served_models=[model],
                                  **fields)


@pytest.mark.parametrize("case", ["openai", "anthropic", "gemini", "azure", "bedrock-converse", "bedrock-anthropic",
                                  "bedrock-api-key", "vertex-gemini", "vertex-claude", "openai-embeddings",
                                  "gemini-embeddings", "vertex-embeddings", "bedrock-titan", "bedrock-cohere"])
def test_a_working_channel_of_every_kind_tests_ok(admin_client, simulator, case):
    kind, secret, model, fields = working(simulator)[case]
    channel = sim_channel(simulator, f"{case}-ok", kind, secret, model, fields)
    level, text = press_test(admin_client, channel)
    upstream = model.partition("=")[2] or model
    assert level == "success"
    assert re.fullmatch(rf"Channel {re.escape(channel.name)}: HTTP 200 in \d+ ms \(model {re.escape(upstream)}\)\.",
                        text)
    if case.endswith(("embeddings", "titan", "cohere")):
        asked = [r for r in httpx.get(f"{simulator.url}/_sim/records").json() if r["model"] == upstream][-1]
        assert asked["protocol"].endswith("embeddings")  # an embeddings endpoint, not a chat one


@pytest.mark.parametrize(
    ("kind", "secret", "model", "fields", "status", "words"),
    [
        ("openai", "sim:status=401", "gpt-probe", {}, 401, '"code":"invalid_api_key"'),
        ("anthropic", "sim:status=500", "claude-probe", {}, 500, '"type":"api_error"'),
        ("gemini", "sim:status=400,reason=API_KEY_INVALID", "gemini-probe", {}, 400, '"reason":"API_KEY_INVALID"'),
        ("azure", "sim:status=403", "gpt-4o=prod-gpt-4o", {}, 403, "simulated upstream failure (status 403)"),
        ("bedrock", f"{SIM_AWS_ACCESS_KEY_ID}:not-the-secret-access-key", NOVA, {"region": "eu-west-3"}, 403,
         "The request signature we calculated does not match"),
        ("bedrock", "AKIAUNKNOWNTOAWS0001:some-secret-access-key", NOVA, {"region": "eu-west-3"}, 403,
         "The security token included in the request is invalid."),
        ("bedrock", f"{AWS_PAIR}:sim:status=500", f"claude={CLAUDE_PROFILE}", {"region": "us-west-2"}, 500,
         "simulated upstream failure (status 500)"),
        ("vertex", "directives:status=403", "gemini-2.0-flash", {"project": "p", "location": "us-east5"}, 403,
         '"status":"PERMISSION_DENIED"'),
        ("vertex", "directives:token_status=400", "claude-sonnet-4-5@20250929",
         {"project": "p", "location": "us-east5"},
         None, "token exchange refused (400)"),
    ],
)
def test_a_failing_channel_shows_the_providers_words_and_never_its_key(
        admin_client, simulator, kind, secret, model, fields, status, words):
    if secret.startswith("directives:"):
        secret = vertex_key(simulator, secret.partition(":")[2])
    channel = sim_channel(simulator, f"{kind}-failing", kind, secret, model, fields)
    level, text = press_test(admin_client, channel)
    assert level == "error"
    answer = f"HTTP {status}" if status else "no answer"
    assert text.startswith(f"Channel {channel.name}: {answer} in ") and words in text
    for piece in {secret, *secret.split(":")} - {"sim", "status=500"}:
        assert piece not in text


@pytest.mark.parametrize(
    ("kind", "secret", "model", "fields", "words"),
    [
        ("anthropic", "sim:error_after_preamble=overloaded", "claude-probe", {}, "overloaded_error"),
        ("openai", "sim:error_after=1", "gpt-probe", {}, '"type":"server_error"'),
        ("gemini", "sim:error_after=1", "gemini-probe", {}, '"status":"INTERNAL"'),
        ("bedrock", f"{AWS_PAIR}:sim:exception_after=1,exception=throttlingException", NOVA, {"region": "us-east-1"},
         '"exceptionType":"throttlingException"'),
        ("bedrock", f"{AWS_PAIR}:sim:error_after_preamble=overloaded", CLAUDE_PROFILE, {"region": "us-east-1"},
         "overloaded"),
    ],
)
def test_an_error_inside_a_200_answer_fails_the_test(admin_client, simulator, kind, secret, model, fields, words):
    channel = sim_channel(simulator, f"{kind}-error-event", kind, secret, model, fields)
    level, text = press_test(admin_client, channel)
    assert level == "error"
    assert text.startswith(f"Channel {channel.name}: HTTP 200 in ") and words in text


def test_a_channel_that_does_not_answer_says_so(admin_client):
    channel = make_channel("dead", base_url="http://127.0.0.1:9/v1")
    level, text = press_test(admin_client, channel)
    assert level == "error"
    assert re.fullmatch(r"Channel dead: no answer in \d+ ms \(model gpt-test\): could not connect to the channel", text)


def test_a_bedrock_channel_without_a_key_signs_with_the_processs_own_credentials(admin_client, simulator, monkeypatch):
    channel = sim_channel(simulator, "bedrock-chain", "bedrock", "", NOVA, {"region": "us-east-1"})
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    level, text = press_test(admin_client, channel)
    assert level == "error" and "no AWS credentials" in text
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SIM_AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SIM_AWS_SECRET_ACCESS_KEY)
    level, text = press_test(admin_client, channel)
    assert level == "success" and "HTTP 200" in text
    assert SIM_AWS_SECRET_ACCESS_KEY not in text


class StubUpstream(BaseHTTPRequestHandler):
    """Providers the simulator does not play. Under /half/: a chat stream
    that stops, cleanly, before its end marker. Elsewhere: a refusal that
    quotes back the credential it refused, in the error's text."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.startswith("/internal/"):  # not a provider: an internal service's own page
            self.answer(403, "text/html", b"<html><body>internal-admin-console token=s3cr3t</body></html>")
            return
        if self.path.startswith("/half/"):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m1",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "O"}, "finish_reason": None}]}
            self.answer(200, "text/event-stream", b"data: " + json.dumps(chunk).encode() + b"\n\n")
            return
        quoted = [self.path] + [self.headers.get(name, "") for name in (
            "authorization", "x-api-key", "api-key", "x-goog-api-key", "x-amz-security-token")]
        body = {"error": {"message": "Incorrect API key provided: " + " ".join(quoted)}}
        self.answer(401, "application/json", json.dumps(body).encode())

    def answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def stub_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubUpstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_an_answer_that_stops_before_its_end_marker_fails_the_test(admin_client, stub_upstream):
    channel = make_channel("openai-half", base_url=f"{stub_upstream}/half/v1", served_models=["m1"])
    level, text = press_test(admin_client, channel)
    assert (level, text.split(" in ")[0]) == ("error", "Channel openai-half: HTTP 200")
    assert text.endswith(": the answer ended before its end marker")


@pytest.mark.parametrize(
    ("kind", "secret", "fields"),
    [
        ("openai", "sk-proj-quoted-back-0123456789", {}),
        ("openai", "sk-1234", {}),  # shorter than any piece looked for on its own: the whole key still is
        ("anthropic", "sk-ant-quoted-back-0123456789", {}),
        ("gemini", "AIzaSyQuotedBack0123456789", {}),
        ("azure", "0123456789abcdef0123456789abcdef", {}),
        ("bedrock", "AKIAQUOTEDBACK000001:quoted/back/secret+key:quoted-back-session-token", {"region": "us-east-1"}),
        ("bedrock", "ABSKQuotedBackBedrockApiKey0123456789", {"region": "us-east-1"}),
    ],
)
def test_a_key_the_provider_quotes_back_is_masked(admin_client, stub_upstream, kind, secret, fields):
    base_url = stub_upstream + ("/v1" if kind == "openai" else "")
    channel = make_channel(f"{kind}-quoted", protocol=kind, base_url=base_url, secret=secret, served_models=["m1"],
                           **fields)
    level, text = press_test(admin_client, channel)
    assert level == "error" and "HTTP 401" in text and "Incorrect API key provided" in text
    assert MASK in text
    for piece in secret.split(":"):
        assert piece not in text


def test_a_service_accounts_private_key_and_its_id_are_masked_where_quoted():
    key = vertex_service_account("http://127.0.0.1:9")
    secret = json.dumps(key)
    first_line = key["private_key"].splitlines()[1]
    text = masked(f"key {key['private_key_id']} refused; {first_line}; for {key['client_email']}", secret)
    assert key["private_key_id"] not in text and first_line not in text
    assert key["client_email"] in text  # an account's name is not its credential


def test_the_action_tests_every_selected_channel(admin_client, simulator):
    good = sim_channel(simulator, "azure-good", "azure", "azure-key-0001", "gpt-4o=prod", {})
    bad = sim_channel(simulator, "openai-bad", "openai", "sim:status=429", "gpt-probe", {})
    response = admin_client.post(reverse("admin:channels_pool_channel_changelist"),
                                 {"action": "test_channels", "_selected_action": [good.pk, bad.pk]})
    found = sorted(shown_messages(response), key=lambda message: message[1])
    assert [level for level, _ in found] == ["success", "error"]
    assert found[0][1].startswith("Channel azure-good: HTTP 200 in ")
    assert found[1][1].startswith("Channel openai-bad: HTTP 429 in ")


def test_a_test_writes_no_request_log_and_leaves_the_channels_health_alone(admin_client, simulator):
    good = sim_channel(simulator, "openai-good", "openai", "sk-good-0001", "gpt-probe", {})
    bad = sim_channel(simulator, "openai-bad", "openai", "sim:status=500", "gpt-probe", {})
    ChannelHealth.objects.create(channel=bad, state=ChannelHealth.State.HALF_OPEN, successes=5, failures=2,
                                 consecutive_failures=1, last_error_kind="upstream_5xx", last_error="earlier")
    health_before = list(ChannelHealth.objects.values())
    assert press_test(admin_client, good)[0] == "success"
    assert press_test(admin_client, bad)[0] == "error"
    admin_client.post(reverse("admin:channels_pool_channel_changelist"),
                      {"action": "test_channels", "_selected_action": [good.pk, bad.pk]})
    assert list(ChannelHealth.objects.values()) == health_before
    assert not RequestLog.objects.exists() and not LedgerEntry.objects.exists()


def test_the_button_is_a_post_offered_to_who_may_change_the_channel(admin_client):
    channel = make_channel("openai-1")
    page = admin_client.get(change_url(channel)).content.decode()
    assert re.search(rf'<form method="post" action="{re.escape(button_url(channel))}">', page)
    assert 'id="test-channel"' in page
    assert 'id="test-channel"' not in admin_client.get(reverse("admin:channels_pool_channel_add")).content.decode()
    assert admin_client.get(button_url(channel)).status_code == 405
    assert admin_client.post(reverse("admin:channels_pool_channel_test", args=[channel.pk + 1000])).status_code == 404


def test_an_operator_tests_a_channel_with_one_small_request(simulator, sim_records):
    create_staff("oscar", "operator")
    operator = log_in("oscar")
    channel = sim_channel(simulator, "gemini-1", "gemini", "sim:tag=operator-test", "gemini-probe", {})
    assert operator.post(button_url(channel)).status_code == 403  # no CSRF token: refused, nothing sent
    assert sim_records("operator-test") == []
    [(level, text)] = shown_messages(post(operator, button_url(channel)))
    assert level == "success" and text.startswith("Channel gemini-1: HTTP 200 in ")
    [record] = sim_records("operator-test")
    assert record["body"]["generationConfig"]["maxOutputTokens"] <= 16


def test_staff_who_may_not_change_channels_cannot_test_one(simulator, sim_records):
    channel = sim_channel(simulator, "openai-1", "openai", "sim:tag=not-theirs-to-test", "gpt-probe", {})
    create_staff("fiona", "finance")
    finance = log_in("fiona")
    assert post(finance, button_url(channel)).status_code == 403
    response = post(finance, reverse("admin:channels_pool_channel_changelist"),
                    {"action": "test_channels", "_selected_action": [channel.pk]})
    assert response.status_code == 403
    # One who may only look at channels sees no button and may not press it.
    viewer = User.objects.create_user("vera", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_channel"))
    client = log_in("vera")
    page = client.get(change_url(channel))
    assert page.status_code == 200 and 'id="test-channel"' not in page.content.decode()
    assert post(client, button_url(channel)).status_code == 403
    changelist = client.get(reverse("admin:channels_pool_channel_changelist")).content.decode()
    assert 'value="test_channels"' not in changelist
    assert sim_records("not-theirs-to-test") == []  # the channel was never sent a request


def test_an_answer_that_is_not_a_providers_error_shows_no_words(admin_client, stub_upstream):
    channel = make_channel("openai-internal", base_url=f"{stub_upstream}/internal/v1", served_models=["m1"])
    level, text = press_test(admin_client, channel)
    assert level == "error" and "HTTP 403" in text and "not a model provider's error" in text
    assert "internal-admin-console" not in text and "s3cr3t" not in text


@pytest.mark.parametrize("base_url", ["http://169.254.169.254/latest", "http://[fe80::1]:8080", "http://0.0.0.0:9",
                                      "http://[::ffff:169.254.169.254]/latest"])
def test_a_channel_cannot_point_at_the_link_local_range(admin_client, base_url):
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), {
        "name": "metadata", "protocol": "openai", "base_url": base_url, "secret": "sk-x", "served_models": "m1",
        "priority": "0", "weight": "1", "enabled": "on"})
    assert response.status_code == 200 and "may not point there" in response.content.decode()
    assert not Channel.objects.filter(name="metadata").exists()


def test_loopback_is_refused_when_the_setting_says_so(admin_client, settings, stub_upstream):
    settings.HOPBASE_ALLOW_LOOPBACK_CHANNELS = False
    form = {"name": "local", "protocol": "openai", "base_url": "http://localhost:9/v1", "secret": "sk-x",
            "served_models": "m1", "priority": "0", "weight": "1", "enabled": "on"}
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), form)
    assert "this machine: a channel may not point there" in response.content.decode()
    assert not Channel.objects.filter(name="local").exists()
    # One saved before the setting changed is refused when tested, with no request made.
    channel = make_channel("openai-saved-local", base_url=f"{stub_upstream}/v1", served_models=["m1"])
    level, text = press_test(admin_client, channel)
    assert level == "error" and "may not point there" in text and "Incorrect API key" not in text
