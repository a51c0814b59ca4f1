"""The settlement sweep (B6): whatever a lost task left unsettled is settled by a
periodic sweep (Celery beat with Redis, in-process without), or by hand with
``manage.py settle``.

The in-process sweep's own run is on committed data, marked ``gateway`` so it
runs with the other integration tests.
"""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from billing import settlement
from billing.checks import ledger_problems
from billing.finished import Finished
from billing.jobs import in_process_sweep_interval, settlement_sweep
from billing.models import RequestLog
from billing.recorder import Recorder
from billing.settlement import sweep, unsettled
from billing.tasks import sweep_unsettled
from tests.support.factories import make_key, make_log, unique
from tests.support.settlement_checks import (
    CHARGE,
    PRICED,
    an_hour_ago,
    assert_charged_once,
    balance,
    funded_tenant,
    priced_model,
    settled_count,
    wait_for,
)


@pytest.mark.django_db
class TestSweep:
    def test_it_settles_what_is_old_enough_and_leaves_fresh_logs_to_their_task(self):
        tenant, model = funded_tenant(), priced_model()
        old = [make_log(tenant, model=model, created_at=an_hour_ago(), **PRICED) for _ in range(3)]
        fresh = make_log(tenant, model=model, **PRICED)
        result = sweep()
        assert result.settled == 3
        assert set(unsettled(dt.timedelta(0)).filter(tenant=tenant)) == {fresh}
        assert all(RequestLog.objects.get(pk=log.pk).settled_at for log in old)

    def test_it_works_in_batches_and_passes_over_unpriced_logs(self):
        tenant, model = funded_tenant(), priced_model()
        logs = [make_log(tenant, model=model if i % 4 else "unpriced-x", created_at=an_hour_ago(), **PRICED)
                for i in range(11)]
        result = sweep(batch=3)
        assert (result.settled, result.unpriced) == (8, 3)
        assert balance(tenant) == Decimal("10") - 8 * CHARGE
        assert unsettled().filter(tenant=tenant).count() == 3
        assert sweep(batch=3).settled == 0  # nothing twice
        assert len(logs) == 11

    def test_the_sweep_task_takes_a_delay(self):
        tenant, model = funded_tenant(), priced_model()
        make_log(tenant, model=model, **PRICED)
        assert sweep_unsettled.apply().get() == 0
        assert sweep_unsettled.apply(kwargs={"older_than": 0}).get() == 1

    def test_beat_runs_the_sweep_every_interval(self):
        entry = settings.CELERY_BEAT_SCHEDULE["sweep-unsettled-request-logs"]
        assert entry["task"] == sweep_unsettled.name
        assert entry["schedule"] == settings.HOPBASE_SWEEP_INTERVAL


@pytest.mark.django_db
class TestSettleCommand:
    def run(self) -> str:
        out = io.StringIO()
        call_command("settle", stdout=out, stderr=io.StringIO())
        return out.getvalue()

    def test_it_settles_everything_now_and_says_how_many(self):
        tenant, model = funded_tenant(), priced_model()
        for status in ("completed", "cancelled", "failed"):
            make_log(tenant, model=model, status=status, **PRICED)
        assert self.run().splitlines()[-1] == "settled 3 request logs"
        assert self.run().splitlines()[-1] == "settled 0 request logs"
        assert balance(tenant) == Decimal("10") - 2 * CHARGE
        assert ledger_problems() == []

    def test_it_fails_when_a_log_cannot_be_priced(self):
        make_log(funded_tenant(), model="unpriced-y", **PRICED)
        with pytest.raises(CommandError, match="1 request logs have no price") as caught:
            self.run()
        assert caught.value.returncode == 1


def test_without_redis_the_gateway_sweeps_in_process_and_with_redis_beat_does(settings):
    settings.REDIS_URL = None
    settings.HOPBASE_SWEEP_INTERVAL = 42
    assert in_process_sweep_interval() == 42
    job = settlement_sweep()
    assert job is not None and job._interval == 42
    assert job._first_delay == settlement.SWEEP_DELAY.total_seconds()  # soon after start-up
    assert not job.running  # made, not started: serving.background starts it
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert in_process_sweep_interval() is None
    assert settlement_sweep() is None


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_the_in_process_sweep_settles_what_was_left_behind_and_leaves_new_logs_to_their_task(settings):
    settings.REDIS_URL = None
    settings.HOPBASE_SWEEP_INTERVAL = 0.05
    tenant, model = funded_tenant(), priced_model()
    key, _ = make_key(tenant)
    left_behind = [make_log(tenant, key, model=model, created_at=an_hour_ago(), **PRICED).pk for _ in range(2)]
    published: list[list[int]] = []
    recorder = Recorder(publish=published.append)
    job = settlement_sweep()
    assert job is not None
    job.start()
    try:
        fresh = Finished(request_id=unique("req-sweep"), created_at=timezone.now(), tenant_id=tenant.pk,
                         api_key_id=key.pk, protocol="chat", status="rejected")
        recorder.record(fresh)
        assert recorder.flush(10)
        wait_for(lambda: settled_count(left_behind) == 2, 30, "the in-process sweep")
        # The new row went to its task (here: a list), not to the sweep.
        fresh_id = RequestLog.objects.get(request_id=fresh.request_id).pk
        assert published == [[fresh_id]]
        assert settled_count([fresh_id]) == 0
    finally:
        stopped = job.stop(10)
        recorder.stop()
    assert stopped
    assert_charged_once(tenant, left_behind)
