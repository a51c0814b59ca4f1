"""The tenant console on a running gateway, for the browser's round trip
(tests/processes/test_console_browser.py): a customer of its own on the gateway's
database, made with the operator's commands (createtenant, createapikey,
createtenantuser) in processes of their own; a headless chromium that
drives the gateway process's own ``/console/`` rather than Django's
live-server thread; and the customer's key used with the official openai
SDK against that same gateway, which relays to the upstream simulator.

The customer's rows are committed, as every gateway test's are (the gateway
is another process); its tenant's name is unique to the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai

from billing.models import ModelPrice, RequestLog
from billing.settlement import Outcome, settle
from console.models import TenantMembership
from tenants.models import Tenant
from tests.conftest import database_url_for_subprocess
from tests.support.browser import start_chromium
from tests.support.console_cast import PASSWORD, email
from tests.support.processes import ROOT
from tests.support.protocol_checks import openai_client
from tests.support.wire import wait_for_log

MODEL = "sim-model"  # priced and served by the test world's channels (tests/conftest.py)


@dataclass
class Customer:
    tenant: Tenant
    owner: TenantMembership


def operator(*args: str, stdin: str = "") -> str:
    """``manage.py ARGS`` in a process of its own, as an operator's shell runs
    it, on the gateway's database; its output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DATABASE_URL": database_url_for_subprocess()},
    )
    assert done.returncode == 0, f"manage.py {args[0]} failed:\n{done.stderr}"
    return done.stdout


def customer() -> Customer:
    """A tenant made by its operator's commands: money, and one key for MODEL
    only, so that MODEL is all the console offers its owner
    (console.keys.allowance); and the owner. The password is hashed as the
    command's settings say (a test module's fast hasher is no gateway's)."""
    name = f"console-roundtrip-{uuid.uuid4().hex[:8]}"
    operator("createtenant", name, "--balance", "50")
    operator("createapikey", name, "--name", "from-the-operator", "--models", MODEL)
    operator("createtenantuser", name, email("owner"), "--role", "owner", "--password-stdin", stdin=PASSWORD + "\n")
    owner = TenantMembership.objects.select_related("tenant", "user").get(tenant__name=name)
    return Customer(owner.tenant, owner)


@contextmanager
def chromium(tmp: Path, size: tuple[int, int]) -> Iterator[Any]:
    """A headless chromium (tests/support/browser.py) whose ``downloads`` is its download folder."""
    profile, downloads = tmp / "profile", tmp / "downloads"
    profile.mkdir()
    downloads.mkdir()
    driver = start_chromium(profile, downloads, size)
    # Asked again of the running browser: at start, headless chromium makes no window narrower than 500 px.
    driver.set_window_size(*size)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Call:
    request_id: str
    prompt_tokens: int
    completion_tokens: int


def chat(gateway, secret: str) -> Call:
    """One Chat Completions request with the openai SDK; what the gateway says of it."""
    raw = openai_client(gateway, secret).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello from the console's key [sim tokens=5]"}]
    )
    usage = raw.parse().usage
    return Call(raw.headers["x-hopbase-request-id"], usage.prompt_tokens, usage.completion_tokens)


def refusal(gateway, secret: str) -> openai.AuthenticationError | None:
    """The SDK's error for a refused key; None while the key is still served."""
    try:
        chat(gateway, secret)
    except openai.AuthenticationError as error:
        return error
    return None


def settled(call: Call) -> RequestLog:
    """The call's log, settled here as the Celery worker would (none runs beside the test gateway)."""
    log = wait_for_log(call.request_id)
    assert log is not None, f"the gateway wrote no log for {call.request_id}"
    assert settle(log.pk) in (Outcome.CHARGED, Outcome.ALREADY)  # the gateway's own sweep may have been first
    log.refresh_from_db()
    return log


def price_of(log: RequestLog) -> Decimal:
    """What the log's tokens cost at MODEL's price then (the tenant's multiplier is 1)."""
    price = ModelPrice.objects.in_force(log.created_at)[MODEL]
    return (log.input_tokens * price.input_usd_per_mtok + log.output_tokens * price.output_usd_per_mtok) \
        / Decimal(1_000_000)


def row_cells(driver, request_id: str) -> list[str]:
    """The text of each cell of the table row that links to REQUEST_ID ([] when none does)."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.XPATH, f"//tr[td/a[normalize-space()='{request_id}']]")
    return [cell.text.strip() for cell in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []
