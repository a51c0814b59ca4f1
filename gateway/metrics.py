"""``GET /metrics``: Prometheus text, from ``prometheus-client``.

Counted as requests go (cheap: a few per request, in shared memory when
multiprocess):

    hopbase_requests_total{protocol,model,status}      every recorded request
    hopbase_upstream_attempts_total{channel,outcome}   ok, or why it failed
    hopbase_time_to_first_token_seconds{protocol,model}
    hopbase_request_duration_seconds{protocol,model}
    hopbase_open_streams                               streams being relayed
    hopbase_limit_refusals_total{kind}                 rate_limit, balance, capacity, spool_full

Computed when scraped (state, not events): ``hopbase_channel_state``
(each channel's breaker, as the fleet last wrote it to the database),
``hopbase_unsettled_requests`` and ``hopbase_oldest_unsettled_seconds``
(settlement lag: the alarm for a dead worker), ``hopbase_dependency_up``
(this process's view of the database and Redis) and ``hopbase_spool_bytes``
(the spool directory, all processes of this host).

``manage.py serve`` runs several processes: it sets ``PROMETHEUS_MULTIPROC_DIR``
(an empty folder of its own) before they start, so whichever answers a
scrape reports totals over all of them, open streams as a live sum.

The ``model`` label takes only priced model names (anything else is
``other``), so client input cannot grow label sets without end.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily

from billing.finished import Finished
from billing.models import RequestLog
from billing.pricing import prices
from channels_pool.models import ChannelHealth
from core.errors import ErrorKind
from core.snapshots import database_call
from core.vocabulary import RequestStatus

MULTIPROCESS = bool(settings.PROMETHEUS_MULTIPROC_DIR)
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LIMIT_KINDS = {ErrorKind.RATE_LIMIT.value: "rate_limit", ErrorKind.BALANCE.value: "balance"}
BREAKER_STATES = ("closed", "open", "half_open")

requests_total = Counter("hopbase_requests", "Requests recorded, by how they ended.", ["protocol", "model", "status"])
attempts_total = Counter("hopbase_upstream_attempts", "Attempts on channels, by outcome.", ["channel", "outcome"])
ttft = Histogram(
    "hopbase_time_to_first_token_seconds", "Time to the first content token.", ["protocol", "model"], buckets=SECONDS
)
duration = Histogram(
    "hopbase_request_duration_seconds", "Time from request to its end.", ["protocol", "model"], buckets=SECONDS
)
open_streams = Gauge("hopbase_open_streams", "Streams being relayed.", multiprocess_mode="livesum")
refusals_total = Counter("hopbase_limit_refusals", "Requests refused by a limit.", ["kind"])


class Children:
    """A metric's labelled children, remembered: ``labels()`` checks and
    converts its values on every call, and a request counts several. As
    bounded as the metric itself (its label values are)."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


requests_by = Children(requests_total)
attempts_by = Children(attempts_total)
ttft_by = Children(ttft)
duration_by = Children(duration)


def model_label(model: str) -> str:
    return model if model in prices.known() else "other"


def observe(item: Finished) -> None:
    """One recorded request."""
    model = model_label(item.model)
    protocol = item.protocol.value
    requests_by(protocol, model, item.status.value).inc()
    if item.status is RequestStatus.REJECTED:
        if kind := LIMIT_KINDS.get(item.error_kind):
            refusals_total.labels(kind).inc()
        return
    duration_by(protocol, model).observe(item.duration_ms / 1000)
    if item.ttft_ms is not None:
        ttft_by(protocol, model).observe(item.ttft_ms / 1000)


class Counted:
    """The recorder as the gateway uses it: each record counted, then kept."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def record(self, item: Finished) -> None:
        try:
            observe(item)
        finally:
            self._recorder.record(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)


# -- state, when scraped -------------------------------------------------------


def read_state() -> dict[str, Any]:
    """What the database says (one pass, on the database pool)."""
    unsettled = RequestLog.objects.filter(settled_at__isnull=True).aggregate(count=Count("id"), oldest=Min("created_at"))
    channels = list(ChannelHealth.objects.values_list("channel__name", "state"))
    return {"unsettled": unsettled["count"], "oldest": unsettled["oldest"], "channels": channels}


def spool_bytes() -> int:
    directory = settings.HOPBASE_SPOOL_DIR
    total = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.name.endswith(".spool"):
                total += entry.stat().st_size
        except OSError:
            pass  # deleted meanwhile (written to the database, or replayed)
    return total


class StateCollector:
    def __init__(self, state: dict[str, Any] | None, dependencies: dict[str, bool]) -> None:
        self.state = state
        self.dependencies = dependencies

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("hopbase_dependency_up", "1 while this process reaches the dependency.", labels=["dependency"])
        for name, is_up in self.dependencies.items():
            up.add_metric([name], 1 if is_up else 0)
        yield up
        yield GaugeMetricFamily("hopbase_spool_bytes", "Request records on disk not yet in the database.", value=spool_bytes())
        if self.state is None:
            return  # the database did not answer: no state to report
        yield GaugeMetricFamily("hopbase_unsettled_requests", "Request logs not yet in the ledger.", value=self.state["unsettled"])
        oldest = self.state["oldest"]
        lag = max(0.0, time.time() - oldest.timestamp()) if oldest is not None else 0.0
        yield GaugeMetricFamily("hopbase_oldest_unsettled_seconds", "Age of the oldest unsettled request log.", value=lag)
        breaker = GaugeMetricFamily("hopbase_channel_state", "1 for each channel's breaker state.", labels=["channel", "state"])
        for channel, current in self.state["channels"]:
            for state in BREAKER_STATES:
                breaker.add_metric([channel, state], 1 if current == state else 0)
        yield breaker


def registry(state: StateCollector) -> CollectorRegistry:
    if MULTIPROCESS:
        scraped = CollectorRegistry()
        multiprocess.MultiProcessCollector(scraped)
    else:
        scraped = CollectorRegistry()
        scraped.register(_Events())
    scraped.register(state)
    return scraped


class _Events:
    """This process's counters (the default registry), one process alone."""

    def collect(self) -> Iterator[Any]:
        return REGISTRY.collect()


def authorized(request: HttpRequest) -> bool:
    token = settings.HOPBASE_METRICS_TOKEN
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return given[:7].lower() == "bearer " and hmac.compare_digest(given[7:].strip().encode(), token.encode())


async def exposition(dependencies: dict[str, str]) -> bytes:
    """The scrape's text; ``dependencies`` as /readyz reports them."""
    try:
        state = await database_call(read_state)
    except Exception:
        state = None  # the database did not answer: report what this process knows
    up = {name: value == "up" for name, value in dependencies.items() if value != "absent"}
    return generate_latest(registry(StateCollector(state, up)))


class PrometheusMeter:
    """The relay's reports, counted (gateway.relay.collaborators.Meter)."""

    def attempt(self, channel: Any, outcome: str) -> None:
        attempts_by(channel.name, outcome).inc()

    def stream_opened(self) -> None:
        open_streams.inc()

    def stream_closed(self) -> None:
        open_streams.dec()
