"""Driving the admin in a real browser (tests/processes/test_admin_browser.py):
Debian's chromium, headless, through Debian's chromedriver, with Selenium.

Nothing is downloaded: the driver's path is given to Selenium's ``Service``
(so Selenium Manager never runs) and the browser's to its options. When
either is missing, the tests that need them are skipped, saying which
(``.ci/run`` installs both, so CI runs them).

The admin is served by Django's live-server thread (with the static-files
handler, so the admin's CSS and scripts load) on the committed test
database. Not pytest-django's ``live_server`` fixture: it flushes every table
after each test, the staff roles a migration made included, which later
tests read (tests/processes/test_roles.py). The data a browser test commits is deleted
again by ``committed_rows``.

HOPBASE_CHROMIUM and HOPBASE_CHROMEDRIVER name another browser and driver
(a browser and driver of the same version) than Debian's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

CHROMIUM = Path(os.environ.get("HOPBASE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("HOPBASE_CHROMEDRIVER", "/usr/bin/chromedriver"))
SCREENSHOTS = settings.BASE_DIR / "var" / "screenshots"
# A laptop screen: the lists must fit it.
LAPTOP = (1440, 900)
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
    "--disable-extensions", "--no-default-browser-check", "--password-store=basic", "--lang=en-US",
)


def missing() -> str:
    """Why the browser tests cannot run here ('' when they can)."""
    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if absent:
        return f"{' and '.join(absent)} not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements-test.txt)"
    return ""


MISSING = missing()
needs_chromium = pytest.mark.skipif(bool(MISSING), reason=MISSING or "chromium is installed")


def start_chromium(profile: Path, downloads: Path, size: tuple[int, int] = LAPTOP):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.add_experimental_option("prefs", {
        "download.default_directory": str(downloads),
        "download.prompt_for_download": False,
        "download.directory_upgrade": True,
        "safebrowsing.enabled": False,
    })
    # The browser's console, read by console_errors().
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(20)
    # Downloads from a headless browser go where the DevTools protocol says.
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    return driver


@contextmanager
def live_admin(tmp: Path) -> Iterator[Any]:
    """The admin on a live-server thread and a chromium to drive it, whose
    ``admin_url`` is the admin's root and ``downloads`` its download folder."""
    from pytest_django.live_server_helper import LiveServer

    profile, downloads = tmp / "profile", tmp / "downloads"
    profile.mkdir()
    downloads.mkdir()
    server = LiveServer("127.0.0.1")  # a free port
    try:
        driver = start_chromium(profile, downloads)
        try:
            driver.admin_url = f"{server.url}/admin/"
            driver.downloads = downloads
            yield driver
        finally:
            driver.quit()
    finally:
        server.stop()


@contextmanager
def committed_rows() -> Iterator[None]:
    """Rows committed inside are deleted at the end (those that were there
    before stay), children first."""
    from django.apps import apps

    models = [apps.get_model(name) for name in (
        "admin.LogEntry", "sessions.Session", "billing.LedgerEntry", "billing.RequestLog", "hopbase.ApiKey",
        "channels_pool.ChannelHealth", "channels_pool.Channel", "billing.ModelPrice", "hopbase.Tenant", "auth.User",
    )]
    before = {model: set(model._base_manager.values_list("pk", flat=True)) for model in models}
    try:
        yield
    finally:
        for model in models:
            model._base_manager.exclude(pk__in=before[model]).delete()


def screenshot(driver, name: str) -> Path:
    """A test artefact: what the window shows, as var/screenshots/NAME.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver) -> list[dict]:
    """The SEVERE lines of the browser console since it was last read."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(condition: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def downloaded(driver, suffix: str, timeout: float = 10) -> Path:
    """The one download whose name ends with SUFFIX, once it is complete
    (chromium writes NAME.crdownload until then)."""
    def complete() -> Path | None:
        files = list(driver.downloads.iterdir())
        wanted = [path for path in files if path.name.endswith(suffix)]
        return wanted[0] if len(wanted) == 1 and not any(path.suffix == ".crdownload" for path in files) else None

    return wait_for(complete, timeout, f"a download ending {suffix}")


def fits(driver, table_id: str = "result_list") -> dict:
    """As the browser laid them out: the changelist table's width (all of
    it, scrolled or not), the width of the box it scrolls in, and the page's
    width and the window's."""
    return driver.execute_script(
        """
        const table = document.getElementById(arguments[0]);
        return {table: table.scrollWidth, box: table.parentElement.clientWidth,
                page: document.documentElement.scrollWidth, viewport: window.innerWidth};
        """,
        table_id,
    )


def column_visible(driver, css: str) -> bool:
    """Every cell matching CSS is displayed and lies inside the viewport."""
    return driver.execute_script(
        """
        const cells = [...document.querySelectorAll(arguments[0])];
        return cells.length > 0 && cells.every(cell => {
            const box = cell.getBoundingClientRect();
            return box.width > 0 && box.left >= 0 && box.right <= window.innerWidth;
        });
        """,
        css,
    )
