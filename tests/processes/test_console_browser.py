"""The console in a real headless chromium (tests/support/browser.py).

On Django's live-server thread: an owner signs in, sees the overview and
the logs, makes a key and sees its secret once, at 1440 px and at 390 px,
where no page is wider than the window.

The round trip, on a running gateway (tests/support/console_gateway.py): the
gateway process serves the console as well as the API, on one database. An
owner signs in there, makes a key for one model, uses it with the official
openai SDK (the gateway relays to the upstream simulator), sees that
request's row, tokens and charge on the logs page and the charge with the
balance it left on the statement, downloads the statement's CSV (that
charge in it, the file byte for byte ``exportbilling --tenant``), revokes
the key in the page, and the SDK is refused (401). At both widths, under
both servers (plain daphne, and uvicorn as ``manage.py serve`` runs it).

Screenshots are kept under var/screenshots/console-*.png.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from billing.ledger import top_up
from console.models import TenantMembership
from core.money import usd_text
from tenants.models import ApiKey
from tests.support.browser import committed_rows, downloaded, live_admin, missing, screenshot, wait_for
from tests.support.console_cast import PASSWORD, person
from tests.support.console_gateway import MODEL, chat, chromium, customer, price_of, refusal, row_cells, settled
from tests.support.factories import make_channel, make_key, make_log, make_tenant

pytestmark = pytest.mark.skipif(bool(missing()), reason=missing() or "ok")

PAGES = ("/console/", "/console/logs/", "/console/statement/", "/console/keys/", "/console/connect/",
         "/console/people/")


@pytest.fixture
def owner(django_db_setup, django_db_blocker):
    """A test's own (its fast hasher and the deletion of every row committed
    meanwhile must not reach into the round trip's gateway, run after it)."""
    fast_passwords = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    with fast_passwords, django_db_blocker.unblock(), committed_rows():
        tenant = make_tenant("acme-console-browser")
        top_up(tenant, Decimal("25"))
        key, _ = make_key(tenant, label="production")
        make_channel("console-browser-channel", served_models=["gpt-4o-mini", "claude-sonnet-4-5"])
        now = timezone.now()
        for n in range(8):
            make_log(tenant, key, model="gpt-4o-mini", request_id=f"req_console_{n:020x}",
                     created_at=now - dt.timedelta(hours=n * 20), input_tokens=1200, output_tokens=300,
                     charge_usd=Decimal("0.0123456"))
        membership = person(tenant, "owner", "owner")
        try:
            yield membership
        finally:
            TenantMembership.objects.filter(pk=membership.pk).delete()  # before its tenant (PROTECT)


def sign_in(driver, base: str, membership) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/console/login/")
    driver.find_element(By.ID, "id_email").send_keys(membership.user.email)
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(lambda: driver.current_url.endswith("/console/"), what="the overview after sign-in")


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_an_owner_signs_in_reads_every_page_and_makes_a_key(owner, tmp_path, width, height):
    from selenium.webdriver.common.by import By

    with live_admin(tmp_path) as driver:
        driver.set_window_size(width, height)
        base = driver.admin_url.removesuffix("/admin/")
        sign_in(driver, base, owner)
        for path in PAGES:
            driver.get(base + path)
            name = path.removeprefix("/console/").strip("/") or "overview"
            screenshot(driver, f"console-{name}-{width}")
            overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{path} is {overflow} px wider than {width} px"
        driver.get(base + "/console/logs/")
        assert "req_console_" in driver.page_source and "console-browser-channel" not in driver.page_source
        driver.get(base + "/console/keys/")
        driver.find_element(By.ID, "k-name").send_keys(f"from-browser-{width}")
        driver.find_element(By.XPATH, "//button[text()='Create key']").click()
        secret = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "[data-testid=secret]"), what="the secret")
        assert secret[0].text.startswith("hb-")
        screenshot(driver, f"console-key-created-{width}")
        shown = secret[0].text
        driver.get(base + "/console/keys/")
        assert shown not in driver.page_source and f"from-browser-{width}" in driver.page_source


# Each server once (the contract's daphne; uvicorn, manage.py serve's default), each width once:
# the layout does not depend on the server, nor the serving on the width.
@pytest.mark.gateway
@pytest.mark.parametrize(("server", "width", "height"), [("daphne", 1440, 900), ("uvicorn", 390, 844)])
def test_a_key_made_in_the_console_is_used_charged_and_revoked_through_the_gateway(
    request, committed_db, tmp_path, server, width, height
):
    from selenium.webdriver.common.by import By

    gateway = request.getfixturevalue(f"{server}_gateway")
    who = customer()
    name = f"roundtrip-{width}"
    with chromium(tmp_path, (width, height)) as driver:
        sign_in(driver, gateway.url, who.owner)
        driver.get(gateway.url + "/console/keys/")
        driver.find_element(By.ID, "k-name").send_keys(name)
        driver.find_element(By.CSS_SELECTOR, f"input[name=models][value='{MODEL}']").click()
        driver.find_element(By.XPATH, "//button[text()='Create key']").click()
        shown = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "[data-testid=secret]"), what="the secret")
        secret = shown[0].get_attribute("textContent").strip()
        screenshot(driver, f"console-roundtrip-key-{width}")
        key = ApiKey.objects.get(tenant=who.tenant, label=name)
        assert key.allowed_models == [MODEL] and secret.startswith(key.prefix) and not key.revoked

        call = chat(gateway, secret)
        log = settled(call)
        assert (log.tenant_id, log.api_key_id, log.model, log.status) == (who.tenant.pk, key.pk, MODEL, "completed")
        assert (log.input_tokens, log.output_tokens) == (call.prompt_tokens, call.completion_tokens)
        assert log.charge_usd == price_of(log) and log.charge_usd > 0
        charge = usd_text(log.charge_usd)

        driver.get(gateway.url + "/console/logs/")
        # Time, request id, key, model, status, input, output, cached, charge.
        assert row_cells(driver, call.request_id)[1:] == [
            call.request_id, f"{key.prefix}…", MODEL, "completed", str(log.input_tokens), str(log.output_tokens),
            "0", charge,
        ]
        screenshot(driver, f"console-roundtrip-logs-{width}")

        driver.get(gateway.url + "/console/statement/")
        # Time, kind, request, note, amount, balance after: the top-up of 50 less this charge.
        entry = row_cells(driver, call.request_id)
        assert (entry[1], entry[4:]) == ("charge", [usd_text(-log.charge_usd), usd_text(50 - log.charge_usd)])
        screenshot(driver, f"console-roundtrip-statement-{width}")
        driver.find_element(By.XPATH, "//button[normalize-space()='Download requests CSV']").click()
        statement = downloaded(driver, ".csv").read_bytes().decode()
        rows = list(csv.DictReader(io.StringIO(statement)))
        assert [(row["request_id"], row["api_key"], row["model"], row["charge_usd"], row["settled"]) for row in rows] \
            == [(call.request_id, key.prefix, MODEL, charge, "true")]
        export = io.StringIO()
        call_command("exportbilling", tenant=who.tenant.name, format="csv", stdout=export)
        assert statement == export.getvalue()

        driver.get(gateway.url + "/console/keys/")
        driver.find_element(By.CSS_SELECTOR, f"button[aria-label='Revoke key {key.prefix}']").click()
        wait_for(lambda: "is revoked" in driver.page_source, what="the page saying the key is revoked")
        screenshot(driver, f"console-roundtrip-revoked-{width}")
    key.refresh_from_db()
    assert key.revoked
    # The gateway hears of the revocation on Redis, or reads the key afresh within its config TTL.
    refused = wait_for(lambda: refusal(gateway, secret), what="the SDK refused with the revoked key")
    assert refused.status_code == 401
