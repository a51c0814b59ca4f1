"""The admin's request-log and channel lists: the columns
chosen to fit a laptop screen (laid out in a browser by
tests/processes/test_admin_browser.py), and a failed request's channel."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.urls import reverse

from billing.admin import RequestLogAdmin
from channels_pool.admin import ChannelAdmin
from tests.support.factories import make_channel, make_key, make_log, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def row_of(page: str, request_id: str) -> str:
    """The list row whose time carries REQUEST_ID as its tooltip, tags out."""
    row = re.search(rf'<tr>(?:(?!</tr>).)*title="{request_id}"(?:(?!</tr>).)*</tr>', page, re.S)[0]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip()


def test_the_request_log_list_shows_what_an_operator_scans_for():
    assert RequestLogAdmin.list_display == (
        "when", "tenant_key", "model", "channel_tried", "outcome", "ttft", "duration", "tokens", "charge", "settled",
    )
    assert {"health_state", "success_rate", "median_ttft", "last_error"} <= set(ChannelAdmin.list_display)
    assert "base_url" not in ChannelAdmin.list_display  # on the channel's page


def test_a_failed_request_shows_the_last_channel_tried(admin_client):
    tenant = make_tenant("acme")
    key, _ = make_key(tenant)
    channel = make_channel("up-fallback")
    make_log(tenant, key, request_id="req_failed_over", channel=channel, status="failed", error_kind="upstream_5xx",
             attempts=3, duration_ms=900)
    make_log(tenant, key, request_id="req_no_channel", status="failed", error_kind="no_channel", attempts=0)
    make_log(tenant, key, request_id="req_served", channel=channel, ttft_ms=250, duration_ms=1200,
             input_tokens=12, output_tokens=34, usage_estimated=True, charge_usd=Decimal("0.0125"))
    page = admin_client.get(reverse("admin:billing_requestlog_changelist")).content.decode()
    failed = row_of(page, "req_failed_over")
    assert f"acme {key.prefix}" in failed and "up-fallback 3 attempts" in failed and "failed upstream_5xx" in failed
    assert "up-fallback" not in row_of(page, "req_no_channel")
    served = row_of(page, "req_served")
    assert "completed 250 1200 ~12 / 34 0.0125" in served
    # The rest is on the row's page.
    log_id = re.search(r'href="/admin/billing/requestlog/(\d+)/change/[^"]*"><span title="req_failed_over"', page)[1]
    detail = admin_client.get(reverse("admin:billing_requestlog_change", args=[log_id])).content.decode()
    assert "req_failed_over" in detail and "up-fallback" in detail and "Outcome" in detail
