"""Provider state belongs to the tenant that created it:
its owner is noted at once, written to the database in batches, and
enforced from memory; a request naming another tenant's Responses id or
Gemini cache is refused (404 in the caller's format) before any channel is
called; a provider's 404 about a named id is the request's fault, never the
channel's. Unit tests on fakes first, then through the gateway."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from django.db import OperationalError

from channels_pool import provider_state
from channels_pool.affinity import Affinity, ForeignState
from channels_pool.provider_state import Pending, StateOwners
from core import dependencies, snapshots
from core.errors import ErrorKind, GatewayError
from providers.apis import GEMINI, MESSAGES, RESPONSES
from tests.support.relay_fakes import Answer, Upstream, build, caller

OURS, THEIRS = 7, 8  # tenant ids: relay_fakes.caller() is tenant 7


class OwnerTable:
    """ProviderState behind a database that can go down."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.calls: list[str] = []
        self.down = False
        self.saved: list[dict[str, Pending]] = []
        self.failing_saves = 0

    def load(self, state_id: str) -> int | None:
        self.calls.append(state_id)
        if self.down:
            raise OperationalError("could not connect to server: Connection refused")
        return self.rows.get(state_id)

    def save(self, rows: dict[str, Pending]) -> None:
        if self.failing_saves:
            self.failing_saves -= 1
            raise OperationalError("could not connect to server: Connection refused")
        self.saved.append(dict(rows))


@pytest.fixture
def table(monkeypatch) -> OwnerTable:
    dependencies.database.reset()
    monkeypatch.setattr(snapshots, "DEADLINE", 0.3)
    monkeypatch.setattr(dependencies.database, "pause", 0.2)
    yield OwnerTable()
    dependencies.database.reset()


def owners_of(table: OwnerTable) -> StateOwners:
    return StateOwners(load=table.load, save=table.save)


# -- owners: memory first, the database for the rest ------------------------------------


def test_an_owner_noted_here_is_known_without_the_database(table):
    owners = owners_of(table)
    owners.remember("resp_1", OURS, 3)
    assert asyncio.run(owners.owner("resp_1")) == OURS
    assert table.calls == []


def test_an_owner_from_the_database_is_asked_for_once(table):
    table.rows["resp_2"] = THEIRS
    owners = owners_of(table)

    async def scenario() -> list[int | None]:
        return [await owners.owner("resp_2") for _ in range(5)]

    assert asyncio.run(scenario()) == [THEIRS] * 5
    assert table.calls == ["resp_2"]


def test_an_id_never_issued_is_asked_for_again_only_after_a_while(table, monkeypatch):
    monkeypatch.setattr(provider_state, "UNKNOWN_TTL", 0.1)
    owners = owners_of(table)

    async def scenario() -> None:
        assert await owners.owner("resp_bogus") is None
        assert await owners.owner("resp_bogus") is None
        assert table.calls == ["resp_bogus"]
        await asyncio.sleep(0.12)
        table.rows["resp_bogus"] = THEIRS  # noted by another process meanwhile
        assert await owners.owner("resp_bogus") == THEIRS

    asyncio.run(scenario())


def test_an_id_too_long_to_have_been_stored_needs_no_database(table):
    owners = owners_of(table)
    assert asyncio.run(owners.owner("x" * 300)) is None
    owners.remember("x" * 300, OURS, 1)  # nothing to store it in: not noted
    assert owners.pending() == 0 and table.calls == []


def test_through_a_database_outage_known_owners_hold_and_unknown_ids_pass(table):
    table.rows["resp_known"] = THEIRS
    owners = owners_of(table)

    async def scenario() -> None:
        assert await owners.owner("resp_known") == THEIRS
        table.down = True
        assert await owners.owner("resp_known") == THEIRS  # fail closed: still theirs
        started = time.monotonic()
        assert await owners.owner("resp_other") is None  # fail open: cannot tell, the provider will
        assert await owners.owner("resp_third") is None
        assert time.monotonic() - started < 0.5

    asyncio.run(scenario())


def test_owners_are_written_in_batches_and_kept_through_a_failed_write(table):
    owners = owners_of(table)
    owners.remember("resp_a", OURS, 1)
    owners.remember("cachedContents/b", THEIRS, None)
    table.failing_saves = 1
    with pytest.raises(OperationalError):
        owners.write()
    owners.remember("resp_c", OURS, 2)
    assert owners.write() == 3
    assert owners.write() == 0
    (batch,) = table.saved
    assert {state: (row.tenant_id, row.channel_id) for state, row in batch.items()} == {
        "resp_a": (OURS, 1), "cachedContents/b": (THEIRS, None), "resp_c": (OURS, 2),
    }


def test_past_its_bound_the_write_queue_drops_new_owners_but_this_process_enforces_them(table, monkeypatch, caplog):
    monkeypatch.setattr(provider_state, "MAX_PENDING", 2)
    owners = owners_of(table)
    for i in range(3):
        owners.remember(f"resp_{i}", OURS, 1)
    assert owners.pending() == 2 and owners.dropped == 1
    assert "dropped" in caplog.text
    assert asyncio.run(owners.owner("resp_2")) == OURS


@pytest.mark.django_db
def test_owners_reach_the_database_once_each():
    from channels_pool.models import ProviderState
    from tests.support.factories import make_channel, make_tenant

    tenant, channel, gone = make_tenant(), make_channel(), make_channel()
    owners = StateOwners()
    owners.remember("resp_db_1", tenant.pk, channel.pk)
    owners.remember("resp_db_2", tenant.pk, gone.pk)
    gone.delete()  # deleted before the write: the row says no channel
    assert owners.write() == 2
    owners.remember("resp_db_1", tenant.pk + 1000, channel.pk)  # a second writer of one id loses quietly
    owners.write()
    rows = {row.state_id: (row.tenant_id, row.channel_id) for row in ProviderState.objects.all()}
    assert rows == {"resp_db_1": (tenant.pk, channel.pk), "resp_db_2": (tenant.pk, None)}
    assert provider_state.load_owner("resp_db_1") == tenant.pk
    assert provider_state.load_owner("resp_never") is None


# -- affinity refuses what another tenant owns --------------------------------------------


def test_affinity_refuses_another_tenants_state_whoever_remembers_it(table, settings):
    settings.REDIS_URL = None
    table.rows["cachedContents/theirs"] = THEIRS
    affinity = Affinity(owners_of(table))
    affinity.remember("resp_mine", OURS, 4)

    async def scenario() -> None:
        assert await affinity.channel_for("resp_mine", OURS) == 4
        with pytest.raises(ForeignState):
            await affinity.channel_for("resp_mine", THEIRS)  # from this process's memory
        with pytest.raises(ForeignState):
            await affinity.channel_for("cachedContents/theirs", OURS)  # from the database
        assert await affinity.channel_for("resp_never_issued", OURS) is None

    asyncio.run(scenario())
    assert affinity.owners.pending() == 1


# -- the relay: refused before any channel; a provider's 404 is not the channel's --------


def responses_body(previous: str) -> dict:
    return {"model": "any", "stream": True, "input": "hi", "previous_response_id": previous}


def gemini_request(cache: str) -> dict:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "cachedContent": cache}
    route = {"version": "v1beta", "model": "any", "action": "streamGenerateContent"}
    return {"api": GEMINI, "body": body, "route": route}


async def serve(bench, api, body, route=None):
    facts = api.parse(body, orjson.dumps(body), route or {})
    return await bench.relay.serve("req_state", api, caller(), facts, {})


@pytest.mark.parametrize(
    ("api", "request_", "expected"),
    [
        (RESPONSES, {"body": responses_body("resp_theirs")},
         lambda body: body["error"]["param"] == "previous_response_id"),
        (GEMINI, gemini_request("resp_theirs"), lambda body: body["error"]["status"] == "NOT_FOUND"),
    ],
)
def test_another_tenants_state_is_refused_before_any_channel_is_called(api, request_, expected):
    upstream = Upstream()
    channel = upstream.channel("a", Answer(200, b"{}"), protocol=api.wire)
    bench = build(upstream, [channel])
    bench.relay.affinity.remember("resp_theirs", THEIRS, channel.id)
    reply = asyncio.run(serve(bench, request_.get("api", api), request_["body"], request_.get("route")))
    assert reply.status == 404
    assert expected(orjson.loads(reply.body))
    assert upstream["a"].requests == []
    log = bench.recorder.only
    assert (log.status, log.error_kind, log.attempts) == ("rejected", ErrorKind.STATE_NOT_FOUND.value, 0)


def test_the_refusal_in_anthropics_format_is_not_found_error():
    status, body = MESSAGES.error_body(GatewayError(ErrorKind.STATE_NOT_FOUND))
    assert status == 404 and orjson.loads(body)["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("api", "request_", "answer"),
    [
        (RESPONSES, {"body": responses_body("resp_bogus")}, Answer(404, b'{"error": {"message": "not found"}}')),
        (GEMINI, gemini_request("cachedContents/bogus"), Answer(404, b'{"error": {"code": 404}}')),
        (GEMINI, gemini_request("cachedContents/bogus"),
         Answer(403, b'{"error": {"code": 403, "message": "CachedContent not found (or permission denied)"}}')),
    ],
)
def test_a_providers_404_about_a_named_id_is_the_requests_fault_not_the_channels(settings, api, request_, answer):
    settings.HOPBASE_BREAKER_FAILURES = 1
    upstream = Upstream()
    first = upstream.channel("first", answer, protocol=api.wire)
    second = upstream.channel("second", answer, protocol=api.wire)
    bench = build(upstream, [first, second])

    async def scenario() -> list[int]:
        return [(await serve(bench, api, request_["body"], request_.get("route"))).status for _ in range(3)]

    assert asyncio.run(scenario()) == [404, 404, 404]
    assert len(upstream["first"].requests) == 3 and upstream["second"].requests == []  # no failover either
    breaker = bench.board._breakers.get(first.id)
    assert breaker is None or (breaker.state, breaker.failures) == ("closed", 0)


def test_a_404_without_named_state_still_counts_against_the_channel():
    upstream = Upstream()
    bad = upstream.channel("bad", Answer(404))
    good = upstream.channel("good", Answer(404))
    bench = build(upstream, [bad, good])
    reply = asyncio.run(serve(bench, RESPONSES, {"model": "any", "stream": True, "input": "hi"}))
    assert reply.status == 500  # every channel failed (F2: a 404 is the channel refusing the model)
    assert bench.board._breakers[bad.id].failures == 1


# -- through the gateway ------------------------------------------------------------


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
class TestThroughTheGateway:
    def test_another_tenants_cache_name_is_refused_without_an_upstream_call(self, gateway, world):
        from tests.support.relay_checks import new_tag, post
        from tests.support.wire import records, wait_for_log, wait_for_records

        tag = new_tag()
        contents = [{"role": "user", "parts": [{"text": f"doc [sim tag={tag}]"}]}]
        created = httpx.post(
            f"{gateway.url}/v1beta/cachedContents",
            json={"model": "models/affinity-model", "contents": contents},
            headers={"x-goog-api-key": world.key},
        )
        assert created.status_code == 200
        name = created.json()["name"]
        wait_for_records(world.simulator.url, tag)
        other = post(gateway, "gemini", world.other_key, "affinity-model", f"peek [sim tag={tag}]", cachedContent=name)
        assert other.status_code == 404
        assert other.json()["error"]["status"] == "NOT_FOUND"
        assert "cachedContent" in other.json()["error"]["message"]
        assert len(records(world.simulator.url, tag)) == 1  # the creation only
        log = wait_for_log(other.headers["x-hopbase-request-id"])
        assert (log.status, log.error_kind, log.tenant_id) == ("rejected", "state_not_found", world.other_tenant_id)
        # The owner still follows it.
        mine = post(gateway, "gemini", world.key, "affinity-model", "and then?", cachedContent=name)
        assert mine.status_code == 200

    @pytest.mark.parametrize(("spellings", "status"), [
        ({"cachedContent": "", "cached_content": "NAME"}, 400),
        ({"cachedContent": None, "cached_content": "NAME"}, 400),
        ({"cached_content": "NAME"}, 404),
        ({"cachedContent": {"name": "NAME"}}, 400),
    ])
    def test_no_spelling_of_a_cache_name_skips_the_owner_check(self, gateway, world, spellings, status):
        from tests.support.relay_checks import new_tag, post
        from tests.support.wire import records, wait_for_records

        tag = new_tag()
        contents = [{"role": "user", "parts": [{"text": f"doc [sim tag={tag}]"}]}]
        created = httpx.post(f"{gateway.url}/v1beta/cachedContents",
                             json={"model": "models/affinity-model", "contents": contents},
                             headers={"x-goog-api-key": world.key})
        name = created.json()["name"]
        wait_for_records(world.simulator.url, tag)
        body = orjson.loads(orjson.dumps(spellings).replace(b"NAME", name.encode()))
        other = post(gateway, "gemini", world.other_key, "affinity-model", f"peek [sim tag={tag}]", **body)
        assert other.status_code == status, other.text
        assert other.json()["error"]["status"] == ("NOT_FOUND" if status == 404 else "INVALID_ARGUMENT")
        assert len(records(world.simulator.url, tag)) == 1  # the creation only: nothing forwarded

    def test_the_owner_of_a_response_is_written_to_the_database(self, gateway, world):
        from channels_pool.models import ProviderState
        from tests.support.relay_checks import post
        from tests.support.wire import wait_for_log

        first = post(gateway, "responses", world.key, "affinity-model", "hi [sim tokens=2]")
        response_id = first.json()["id"]
        log = wait_for_log(first.headers["x-hopbase-request-id"])
        deadline = time.monotonic() + 5
        while (row := ProviderState.objects.filter(state_id=response_id).first()) is None:
            assert time.monotonic() < deadline, "owner not written"
            time.sleep(0.05)
        assert (row.tenant_id, row.channel_id) == (world.tenant_id, log.channel_id)

    def test_a_bogus_response_id_answered_404_costs_the_channel_nothing(self, gateway, world):
        from channels_pool.models import ChannelHealth
        from tests.support.relay_checks import new_tag, post
        from tests.support.wire import records

        channels = [world.channels["openai-affinity-model-a"], world.channels["openai-affinity-model-b"]]

        def health() -> dict[int, tuple[int, int]]:
            rows = ChannelHealth.objects.filter(channel_id__in=channels)
            return {row.channel_id: (row.successes, row.failures) for row in rows}

        def settled_health() -> dict[int, tuple[int, int]]:
            """The health the gateway writes (about every second), once it
            includes everything sent so far: a success sent now shows in it."""
            successes = sum(success for success, _ in health().values())
            ok = post(gateway, "responses", world.key, "affinity-model", "hi [sim tokens=1]")
            assert ok.status_code == 200
            deadline = time.monotonic() + 5
            while True:
                now = health()
                if sum(success for success, _ in now.values()) > successes:
                    return now
                assert time.monotonic() < deadline
                time.sleep(0.1)

        before = settled_health()
        tag = new_tag()
        for _ in range(5):
            bogus = post(gateway, "responses", world.key, "affinity-model", f"hi [sim tag={tag} status=404]",
                         previous_response_id="resp_never_issued_by_anyone")
            assert bogus.status_code == 404
            error = bogus.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", "previous_response_id")
        assert len(records(world.simulator.url, tag)) == 5  # one channel each: no failover
        after = settled_health()
        assert {c: failures for c, (_, failures) in after.items()} == {
            c: before.get(c, (0, 0))[1] for c in after
        }


# -- a client's bad request never counts against a channel (F2) ------------------------

UNKNOWN_FIELD = orjson.dumps({"error": {
    "code": 400, "status": "INVALID_ARGUMENT",
    "message": 'Invalid JSON payload received. Unknown name "API_KEY_INVALID": Cannot find field.',
    "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                 "fieldViolations": [{"description": 'Unknown name "API_KEY_INVALID"'}]}]}})
KEY_REFUSED = orjson.dumps({"error": {
    "code": 400, "status": "INVALID_ARGUMENT", "message": "API key not valid. Please pass a valid API key.",
    "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                 "domain": "googleapis.com"}]}})


@pytest.mark.parametrize(("answer", "channel_fault"), [(UNKNOWN_FIELD, False), (KEY_REFUSED, True)])
def test_a_gemini_400_is_the_channels_fault_only_when_google_refuses_its_key(settings, answer, channel_fault):
    settings.HOPBASE_BREAKER_FAILURES = 1
    upstream = Upstream()
    first = upstream.channel("first", Answer(400, answer), protocol=GEMINI.wire)
    second = upstream.channel("second", Answer(400, answer), protocol=GEMINI.wire)
    bench = build(upstream, [first, second])
    request = gemini_request("")
    del request["body"]["cachedContent"]
    reply = asyncio.run(serve(bench, GEMINI, request["body"], request["route"]))
    breaker = bench.board._breakers.get(first.id)
    if channel_fault:  # failed over, and the channel's breaker counts it
        assert len(upstream["second"].requests) == 1 and breaker.failures == 1
    else:  # the client's own 400, passed back; the channel is as healthy as before
        assert reply.status == 400 and upstream["second"].requests == []
        assert breaker is None or (breaker.state, breaker.failures) == ("closed", 0)


def test_an_unknown_key_on_gemini_gets_googles_own_words():
    status, body = GEMINI.error_body(GatewayError(ErrorKind.INVALID_KEY))
    error = orjson.loads(body)["error"]
    assert (status, error["message"]) == (400, "API key not valid. Please pass a valid API key.")
    assert error["details"][0]["reason"] == "API_KEY_INVALID"


def test_a_provider_quoting_the_channels_key_leaves_no_secret_in_its_health():
    upstream = Upstream()
    quoting = upstream.channel("quoting", Answer(401, b'{"error": {"message": "Incorrect API key provided: '
                                                       b'sk-quoting. You can find your API key at ..."}}'))
    bench = build(upstream, [quoting])
    asyncio.run(serve(bench, RESPONSES, {"model": "any", "stream": True, "input": "hi"}))
    breaker = bench.board._breakers[quoting.id]
    assert "Incorrect API key provided" in breaker.last_error  # the operator still reads the provider's words
    assert quoting.secret not in breaker.last_error
