"""The API handler (serving.handler): a client that leaves cancels the view or
the stream at once (B1), and its response is still let go of; what the
server awaits for a request is a future for its work; a request
cut from outside (a drain's end) is cut; the API's URL matches are
remembered; a body is read into memory, never more of it than the limit."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core.exceptions import RequestAborted
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import get_resolver

from serving.handler import REMEMBERED_PATH_LENGTH, ApiHandler, Sender, resolved

WITHIN = 5.0


class Client:
    """``receive`` for a request whose body was read: it blocks until the
    client leaves."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


class Sent:
    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.too_slow = None

    def watch(self, too_slow) -> None:
        self.too_slow = too_slow

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)


def closed_response() -> tuple[HttpResponse, list[str]]:
    response = HttpResponse(b"{}", content_type="application/json")
    closed: list[str] = []
    response._resource_closers.append(lambda: closed.append("closed"))
    return response, closed


def test_a_client_that_leaves_while_the_view_runs_cancels_the_view_and_the_request_ends_quietly():
    handler = ApiHandler()
    client, sent = Client(), Sent()
    view_cancelled = asyncio.Event()

    async def view(request):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            view_cancelled.set()
            raise

    handler.run_get_response = view

    async def main() -> None:
        work = asyncio.create_task(handler.respond(None, client.receive, sent))
        await asyncio.sleep(0)
        client.gone.set()
        await asyncio.wait_for(work, WITHIN)  # ends, without a CancelledError
        assert view_cancelled.is_set()
        assert work.cancelling() == 0
        assert sent.messages == []

    asyncio.run(main())


def test_a_client_that_leaves_while_the_answer_goes_out_still_has_it_let_go_of():
    handler = ApiHandler()
    client = Client()
    response, closed = closed_response()

    class SlowSend(Sent):
        async def __call__(self, message: dict) -> None:
            await super().__call__(message)
            client.gone.set()
            await asyncio.Event().wait()  # the socket never takes it

    async def view(request):
        return response

    handler.run_get_response = view
    sent = SlowSend()

    async def main() -> None:
        await asyncio.wait_for(handler.respond(None, client.receive, sent), WITHIN)

    asyncio.run(main())
    assert sent.messages[0]["type"] == "http.response.start"
    assert closed == ["closed"]


def test_a_request_cut_from_outside_is_cut_and_its_response_let_go_of():
    handler = ApiHandler()
    client = Client()
    response, closed = closed_response()
    answered = asyncio.Event()

    async def send(message: dict) -> None:
        answered.set()
        await asyncio.Event().wait()

    async def view(request):
        return response

    handler.run_get_response = view

    async def main() -> None:
        work = asyncio.create_task(handler.respond(None, client.receive, Sender(send)))
        await asyncio.wait_for(answered.wait(), WITHIN)
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(work, WITHIN)

    asyncio.run(main())
    assert closed == ["closed"]


def test_an_answer_the_client_stays_for_goes_out_whole():
    handler = ApiHandler()
    client, sent = Client(), Sent()
    response, closed = closed_response()

    async def view(request):
        return response

    handler.run_get_response = view
    asyncio.run(asyncio.wait_for(handler.respond(None, client.receive, sent), WITHIN))
    assert [m["type"] for m in sent.messages] == ["http.response.start", "http.response.body"]
    assert sent.messages[1]["body"] == b"{}"
    assert closed == ["closed"]


def test_url_matches_are_remembered():
    resolver = get_resolver()
    first = resolved(resolver, "/v1/chat/completions")
    assert resolved(resolver, "/v1/chat/completions") is first
    assert first.func is resolver.resolve("/v1/chat/completions").func
    other = resolved(resolver, "/v1/messages")
    assert other is not first and other.func is resolver.resolve("/v1/messages").func


def test_a_request_cut_from_outside_as_its_client_leaves_is_still_cut():
    handler = ApiHandler()
    client, sent = Client(), Sent()

    async def view(request):
        await asyncio.Event().wait()

    handler.run_get_response = view

    async def main() -> None:
        work = asyncio.create_task(handler.respond(None, client.receive, sent))
        await asyncio.sleep(0)
        client.gone.set()
        await asyncio.sleep(0)  # the listener hears it: its cancel is on its way
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(work, WITHIN)

    asyncio.run(main())


def test_a_view_that_catches_the_disconnect_and_ends_otherwise_leaves_no_cancel_pending():
    handler = ApiHandler()
    client, sent = Client(), Sent()
    response, closed = closed_response()

    async def view(request):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return response

    handler.run_get_response = view

    async def main() -> None:
        work = asyncio.create_task(handler.respond(None, client.receive, sent))
        await asyncio.sleep(0)
        client.gone.set()
        await asyncio.wait_for(work, WITHIN)
        assert work.cancelling() == 0

    asyncio.run(main())
    assert closed == ["closed"]


def test_only_paths_of_a_bounded_length_are_remembered():
    handler = ApiHandler()
    factory = RequestFactory()
    resolved.cache_clear()
    short = factory.post("/v1beta/models/" + "m" * 100 + ":generateContent")
    handler.resolve_request(short)
    long = factory.post("/v1beta/models/" + "m" * REMEMBERED_PATH_LENGTH + ":generateContent")
    assert handler.resolve_request(long).kwargs["model"] == "m" * REMEMBERED_PATH_LENGTH
    assert resolved.cache_info().currsize == 1


def body_messages(*chunks: bytes) -> list[dict]:
    return [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)]


def receiving(messages: list[dict]):
    async def receive() -> dict:
        return messages.pop(0)
    return receive


def test_a_body_in_parts_is_read_whole():
    body = asyncio.run(ApiHandler().read_body(receiving(body_messages(b'{"model"', b"", b': "m"}'))))
    assert body.read() == b'{"model": "m"}'


def test_a_body_past_the_limit_is_read_to_its_end_but_kept_only_to_one_byte_past_it(settings):
    settings.HOPBASE_MAX_BODY_BYTES = 10
    messages = body_messages(b"123456", b"789abc", b"d" * 1000, b"e")
    body = asyncio.run(ApiHandler().read_body(receiving(messages)))
    assert messages == []
    assert body.read() == b"123456789ab"


def test_a_client_that_leaves_while_sending_its_body_aborts_the_request():
    messages = [*body_messages(b"{", b"}")[:1], {"type": "http.disconnect"}]
    with pytest.raises(RequestAborted):
        asyncio.run(ApiHandler().read_body(receiving(messages)))


def answered(handler: ApiHandler, path: str, request=None) -> HttpResponse:
    request = request or RequestFactory().post(path, b"{}", content_type="application/json")
    return asyncio.run(asyncio.wait_for(handler.get_response_async(request), WITHIN))


def test_an_api_path_is_answered_by_its_view_with_the_request_let_go_of_at_the_close():
    request = RequestFactory().post("/v1/chat/completions", b"{}", content_type="application/json")
    response = answered(ApiHandler(), request.path, request)
    assert response.status_code == 401
    assert json.loads(response.content)["error"]["code"] == "invalid_api_key"
    assert any(getattr(closer, "__self__", None) is request for closer in response._resource_closers)


def test_every_api_view_is_a_coroutine_and_none_is_atomic(settings):
    # What the API handler's direct call of the view relies on (the admin's
    # and the tenant console's browser pages go to Django's full handler).
    routes = {str(route.pattern): route.callback for route in get_resolver().url_patterns
              if not str(route.pattern).startswith(("admin", "console"))}
    assert "v1/chat/completions" in routes and len(routes) > 10
    assert [name for name, view in routes.items() if not asyncio.iscoroutinefunction(view)] == []
    assert not any(database.get("ATOMIC_REQUESTS") for database in settings.DATABASES.values())


def test_an_error_answer_is_logged_by_django_unless_hopbase_logged_it_already(caplog):
    handler = ApiHandler()
    loud = HttpResponse(b"{}", status=418)

    async def answer(request):
        return loud

    handler._middleware_chain = answer
    with caplog.at_level("WARNING", logger="django.request"):
        answered(handler, "/v1/chat/completions")
        refused = answered(ApiHandler(), "/v1/chat/completions")
    assert refused.status_code == 401
    assert [record.status_code for record in caplog.records] == [418]


async def served(handler: ApiHandler, scope: dict, receive, send) -> None:
    """What Daphne does with an application: await what it returns."""
    await handler(scope, receive, send)


def test_the_garbage_collector_is_settled_after_the_first_request_and_only_then(monkeypatch):
    from serving import collector
    from serving import handler as handler_module

    monkeypatch.setattr(handler_module, "ensure_started", lambda: None)  # no background jobs
    settled: list[bool] = []
    monkeypatch.setattr(collector, "settled", False)
    monkeypatch.setattr(collector, "settle", lambda: (settled.append(True), setattr(collector, "settled", True)))

    async def client_gone() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [], "query_string": b""}
    handler = ApiHandler()
    assert settled == []
    for _ in range(2):
        asyncio.run(asyncio.wait_for(served(handler, scope, client_gone, send), WITHIN))
    assert settled == [True]


def test_servers_take_the_application_for_asgi_3_and_await_a_future_for_an_api_request(monkeypatch):
    from asgiref.compatibility import guarantee_single_callable

    from hopbase import asgi
    from serving import handler as handler_module

    monkeypatch.setattr(handler_module, "ensure_started", lambda: None)  # no background jobs
    assert guarantee_single_callable(asgi.application) is asgi.application

    async def client_gone() -> dict:
        return {"type": "http.disconnect"}

    async def main() -> None:
        scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [], "query_string": b""}
        work = asgi.application(scope, client_gone, Sent())
        assert isinstance(work, asyncio.Future)
        await asyncio.wait_for(work, WITHIN)

    asyncio.run(main())
