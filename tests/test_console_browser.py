"""The console in a real headless chromium (tests/browser.py): an owner
signs in, sees the overview and the logs, makes a key and sees its secret
once, at 1440 px and at 390 px, where no page is wider than the window.
Screenshots are kept under var/screenshots/console-*.png.

Not here yet (README, "Tenant console"): the round trip through a running
gateway with the OpenAI SDK.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

from billing.ledger import top_up
from console.models import TenantMembership
from tests.browser import committed_rows, live_admin, missing, screenshot, wait_for
from tests.console_cast import PASSWORD, person
from tests.factories import make_channel, make_key, make_log, make_tenant

pytestmark = pytest.mark.skipif(bool(missing()), reason=missing() or "ok")

PAGES = ("/console/", "/console/logs/", "/console/statement/", "/console/keys/", "/console/connect/")


@pytest.fixture(scope="module")
def owner(django_db_setup, django_db_blocker):
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
