"""The admin in a real browser: headless Debian
chromium drives the pages an operator uses in their first hour, logged in
through the login form as a staff user with the operator role. Each test
leaves a screenshot in var/screenshots/. Skipped, saying why, only where
chromium or chromedriver is not installed (tests/support/browser.py)."""

from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone
from selenium.common.exceptions import StaleElementReferenceException

from billing.dashboard import MIN_DAYS_SHOWN
from billing.exports import COLUMNS
from billing.models import RequestLog
from channels_pool.models import Channel, ChannelHealth
from simulator import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY
from tenants.models import ApiKey
from tests.support.browser import (
    column_visible,
    committed_rows,
    console_errors,
    downloaded,
    fits,
    live_admin,
    needs_chromium,
    screenshot,
    wait_for,
)
from tests.support.factories import make_channel, make_key, make_log, make_tenant
from tests.support.staff_checks import PASSWORD, create_staff

pytestmark = needs_chromium

LOG_COLUMNS = (
    "when", "tenant_key", "model", "channel_tried", "outcome", "ttft", "duration", "tokens", "charge", "settled",
)
CHANNEL_COLUMNS = ("name", "protocol", "health_state", "success_rate", "median_ttft", "last_error")


@pytest.fixture(scope="module")
def acme(django_db_setup, django_db_blocker):
    """Committed for the live server's thread to read, and readable by the
    tests (the database stays unblocked for the module); deleted afterwards.
    Every request was made today: one day of data, for the dashboard."""
    fast_passwords = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    with fast_passwords, django_db_blocker.unblock(), committed_rows():
        create_staff("olivia", "operator")
        acme = make_tenant("acme-corporation-international")
        globex = make_tenant("globex")
        key, _ = make_key(acme, label="production")
        primary = make_channel("openai-gpt-4o-mini-primary-eu", base_url="https://api.openai.example.com/v1",
                               served_models=["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"], secret="sk-stored-secret-1")
        fallback = make_channel("openai-gpt-4o-mini-fallback-us", base_url="https://fallback.example.com/v1",
                                served_models=["gpt-4o-mini"], priority=-1)
        make_channel("anthropic-claude-new", protocol="anthropic", base_url="https://api.anthropic.example.com",
                     served_models=["claude-3-5-sonnet-20241022"])
        ChannelHealth.objects.create(channel=primary, state=ChannelHealth.State.CLOSED, successes=98, failures=2,
                                     recent_success_pct=98, median_ttft_ms=412, last_error_kind="timeout")
        ChannelHealth.objects.create(channel=fallback, state=ChannelHealth.State.OPEN, failures=7,
                                     consecutive_failures=7, recent_success_pct=12, last_error_kind="upstream_5xx")
        now = timezone.now().replace(microsecond=0)
        for n in range(6):
            make_log(acme, key, model="claude-3-5-sonnet-20241022", channel=primary, protocol="messages", stream=True,
                     request_id=f"req_{n:024x}", created_at=now - dt.timedelta(seconds=n), input_tokens=123456,
                     output_tokens=7890, cache_read_tokens=100000, ttft_ms=1234, duration_ms=23456,
                     charge_usd=Decimal("0.0123456789"), settled_at=now)
        make_log(globex, model="gpt-4o-mini", channel=primary, request_id="req_globex_completed",
                 created_at=now, input_tokens=10, output_tokens=20, charge_usd=Decimal("0.25"))
        make_log(globex, model="gpt-4o-mini", channel=primary, status=RequestLog.Status.CANCELLED,
                 request_id="req_globex_cancelled", created_at=now, output_tokens=5, charge_usd=Decimal("0.01"))
        # A model name as long as a client may send (the column's 200 characters) fits every page.
        make_log(globex, model="m" * 200, channel=primary, request_id="req_globex_long_model", created_at=now,
                 input_tokens=1, output_tokens=1, charge_usd=Decimal("0.001"))
        # Every attempt failed: the last channel tried is the one shown.
        make_log(acme, key, model="gpt-4o-mini", channel=fallback, status=RequestLog.Status.FAILED,
                          error_kind="upstream_5xx", attempts=2, upstream_status=503, duration_ms=812,
                          request_id="req_every_attempt_failed", created_at=now, charge_usd=Decimal("0"))
        yield acme


@pytest.fixture(scope="module")
def browser(acme, tmp_path_factory):
    """Chromium logged in to the admin, at 1440 x 900, on its own profile."""
    with live_admin(tmp_path_factory.mktemp("chromium")) as driver:
        driver.get(driver.admin_url + "login/")
        driver.find_element("name", "username").send_keys("olivia")
        driver.find_element("name", "password").send_keys(PASSWORD)
        driver.find_element("css selector", "input[type=submit]").click()
        wait_for(lambda: driver.current_url == driver.admin_url, what="the admin index after the login")
        assert "Site administration" not in driver.title and "Operations" in driver.page_source
        yield driver


def test_an_operator_creates_a_key_whose_secret_is_shown_once(browser, acme):
    browser.get(browser.admin_url + "hopbase/apikey/add/")
    # The tenant is an autocomplete (select2): type, then take the match.
    browser.find_element("css selector", ".field-tenant .select2-selection").click()
    browser.find_element("css selector", ".select2-search__field").send_keys("acme-corp")
    def take_the_match() -> bool:
        # The results list is drawn again as each search answers: an option
        # found may be gone by the time it is clicked, so look again.
        try:
            matches = [o for o in browser.find_elements("css selector", ".select2-results__option")
                       if o.text == acme.name]
            if matches:
                matches[0].click()
            return bool(matches)
        except StaleElementReferenceException:
            return False

    wait_for(take_the_match, what="the tenant in the autocomplete")
    browser.find_element("name", "label").send_keys("made-in-a-browser")
    browser.find_element("name", "_save").click()
    secret = wait_for(lambda: browser.find_elements("id", "issued-secret"), what="the issued secret")[0]
    value = secret.get_attribute("value")
    screenshot(browser, "key-issued")
    key = ApiKey.objects.get(label="made-in-a-browser")
    assert ApiKey.objects.authenticate(value) == key and value.startswith(key.prefix)
    # A reload neither sends the form again (a second key) nor shows the
    # secret: it shows the key's page.
    browser.refresh()
    wait_for(lambda: browser.current_url.endswith(f"/hopbase/apikey/{key.pk}/change/"), what="the key's page")
    assert key.prefix in browser.page_source and value not in browser.page_source
    assert ApiKey.objects.filter(label="made-in-a-browser").count() == 1
    browser.get(browser.admin_url + "hopbase/apikey/")
    assert key.prefix in browser.page_source and value not in browser.page_source
    assert console_errors(browser) == []


def test_a_new_channel_secret_is_never_echoed(browser):
    browser.get(browser.admin_url + "channels_pool/channel/add/")
    fields = {"name": "gemini-browser", "base_url": "not a url", "secret": "sk-typed-in-a-browser",
              "served_models": "gemini-2.0-flash"}
    for name, value in fields.items():
        browser.find_element("name", name).send_keys(value)
    browser.find_element("css selector", "select[name=protocol] option[value=gemini]").click()
    browser.find_element("name", "_save").click()
    # Refused for its base URL: the form comes back, its secret field empty.
    wait_for(lambda: browser.find_elements("css selector", ".errornote"), what="the form's errors")
    assert browser.find_element("name", "secret").get_attribute("value") == ""
    assert "sk-typed-in-a-browser" not in browser.page_source
    assert browser.find_element("name", "name").get_attribute("value") == "gemini-browser"
    base_url = browser.find_element("name", "base_url")
    base_url.clear()
    base_url.send_keys("https://generativelanguage.example.com")
    browser.find_element("name", "secret").send_keys("sk-typed-in-a-browser")
    browser.find_element("name", "_continue").click()
    wait_for(lambda: "/change/" in browser.current_url, what="the new channel's page")
    channel = Channel.objects.get(name="gemini-browser")
    assert channel.secret == "sk-typed-in-a-browser"
    assert browser.find_element("name", "secret").get_attribute("value") == ""
    assert "sk-typed-in-a-browser" not in browser.page_source
    screenshot(browser, "channel-added")


def test_the_channel_list_shows_health_on_a_laptop_screen(browser):
    browser.get(browser.admin_url + "channels_pool/channel/")
    screenshot(browser, "channel-list")
    width = fits(browser)
    assert width["table"] <= width["box"] and width["page"] <= width["viewport"], width
    for column in CHANNEL_COLUMNS:
        assert column_visible(browser, f"#result_list .column-{column}, #result_list .field-{column}"), column
    cells = {row.find_element("css selector", ".field-name").text: row.text
             for row in browser.find_elements("css selector", "#result_list tbody tr")}
    assert "Closed (healthy)" in cells["openai-gpt-4o-mini-primary-eu"]
    assert "Open (skipped)" in cells["openai-gpt-4o-mini-fallback-us"]
    assert "upstream_5xx" in cells["openai-gpt-4o-mini-fallback-us"]
    assert "no record yet" in cells["anthropic-claude-new"]
    assert "sk-stored-secret-1" not in browser.page_source


CHANNEL_SETTINGS = ("region", "project", "location", "api_version")


def shown_rows(browser, names: tuple[str, ...]) -> set[str]:
    return {name for name in names if browser.find_element("css selector", f".form-row.field-{name}").is_displayed()}


def test_the_channel_form_shows_the_settings_of_the_chosen_kind(browser):
    from selenium.webdriver.support.select import Select

    browser.get(browser.admin_url + "channels_pool/channel/add/")
    kind = Select(browser.find_element("name", "protocol"))
    assert shown_rows(browser, CHANNEL_SETTINGS) == set()  # no kind chosen yet
    for value, rows in [("bedrock", {"region"}), ("vertex", {"project", "location"}), ("azure", {"api_version"}),
                        ("openai", set()), ("bedrock", {"region"}), ("anthropic", set()), ("gemini", set())]:
        kind.select_by_value(value)
        assert shown_rows(browser, CHANNEL_SETTINGS) == rows, value
    # A stored key may be removed only where the kind needs none.
    channel = make_channel("bedrock-browser", protocol="bedrock", region="eu-west-3",
                           base_url="https://bedrock-runtime.eu-west-3.amazonaws.com", secret="ABSK-never-shown-0001")
    browser.get(browser.admin_url + f"channels_pool/channel/{channel.pk}/change/")
    assert shown_rows(browser, (*CHANNEL_SETTINGS, "clear_secret")) == {"region", "clear_secret"}
    assert browser.find_element("name", "region").get_attribute("value") == "eu-west-3"
    screenshot(browser, "channel-bedrock")
    Select(browser.find_element("name", "protocol")).select_by_value("vertex")
    assert shown_rows(browser, (*CHANNEL_SETTINGS, "clear_secret")) == {"project", "location"}
    assert "ABSK-never-shown-0001" not in browser.page_source
    assert console_errors(browser) == []


def test_an_operator_tests_a_channel_from_its_page(browser, simulator):
    channel = make_channel("bedrock-simulated", protocol="bedrock", region="us-east-1", base_url=simulator.url,
                           secret=f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}",
                           served_models=["nova=us.amazon.nova-pro-v1:0"])
    browser.get(browser.admin_url + f"channels_pool/channel/{channel.pk}/change/")
    browser.find_element("id", "test-channel").click()
    message = wait_for(lambda: browser.find_elements("css selector", ".messagelist .success"),
                       what="the test's message")[0].text
    screenshot(browser, "channel-tested")
    assert message.startswith("Channel bedrock-simulated: HTTP 200 in ") and "us.amazon.nova-pro-v1:0" in message
    assert browser.current_url.endswith(f"/channels_pool/channel/{channel.pk}/change/")
    assert SIM_AWS_SECRET_ACCESS_KEY not in browser.page_source
    assert console_errors(browser) == []


# The live server is WSGI, which reads the export's async stream whole (and
# says so); the gateway serves it under ASGI, streamed (tests/billing/test_exports.py).
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_request_logs_fit_filter_and_export_as_csv(browser):
    browser.get(browser.admin_url + "billing/requestlog/")
    screenshot(browser, "request-logs")
    width = fits(browser)
    assert width["table"] <= width["box"] and width["page"] <= width["viewport"], width
    for column in LOG_COLUMNS:
        assert column_visible(browser, f"#result_list .column-{column}, #result_list .field-{column}"), column
    # The failed request names the channel that failed.
    failed = browser.find_element("xpath", "//tr[.//span[@title='req_every_attempt_failed']]")
    assert "openai-gpt-4o-mini-fallback-us" in failed.find_element("css selector", ".field-channel_tried").text
    assert "failed" in failed.find_element("css selector", ".field-outcome").text

    browser.find_element("css selector", "#changelist-filter a[href*='status__exact=failed']").click()
    wait_for(lambda: "status__exact=failed" in browser.current_url, what="the filtered list")
    shown = browser.find_elements("css selector", "#result_list tbody tr")
    assert len(shown) == 1
    screenshot(browser, "request-logs-failed")
    browser.find_element("link text", "EXPORT CSV").click()
    with downloaded(browser, ".csv").open(newline="") as file:
        exported = list(csv.reader(file))
    assert exported[0] == list(COLUMNS)
    assert [row[0] for row in exported[1:]] == ["req_every_attempt_failed"]
    assert exported[1][COLUMNS.index("channel")] == "openai-gpt-4o-mini-fallback-us"
    assert console_errors(browser) == []


def test_the_dashboard_draws_its_charts_for_the_days_with_data(browser):
    browser.get(browser.admin_url + "dashboard/")
    screenshot(browser, "dashboard")
    charts = browser.find_elements("css selector", ".hb-chart svg")
    assert len(charts) == 5
    for chart in charts:
        bars = chart.find_elements("css selector", "rect")
        # One day of data: a week of bars (not thirty), today's drawn.
        assert len(bars) == MIN_DAYS_SHOWN
        assert bars[-1].rect["height"] > 0 and chart.rect["width"] > 300
    assert len(browser.find_elements("css selector", "#per-day tbody tr")) == MIN_DAYS_SHOWN
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1]
    assert console_errors(browser) == []
