"""The soak, short (bench/soak.py --duration 20): two gateways under mixed
traffic with client hang-ups, stalls, mid-stream errors and cuts, a Celery
worker killed and restarted, and Redis outages made through the soak's
proxy. Nothing the client was given a request id for may be missing from
the request logs, nothing charged twice, no slot left counted in Redis,
the ledger consistent, and the gateways' memory flat after the warm-up.

It runs as a subprocess on the test database's server (a database of its
own, made and dropped by the soak) and the test Redis server, in a Redis
database of its own (its worker consumes Celery's default queue there):
``SOAK_REDIS_URL`` names another one if that one is taken.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import database_url_for_subprocess
from tests.support.processes import ROOT

DURATION = 20
# A hang detector for the whole soak (about 30 s of it), within pytest's own timeout.
WITHIN = 110


def soak_redis_url() -> str:
    if os.environ.get("SOAK_REDIS_URL"):
        return os.environ["SOAK_REDIS_URL"]
    parts = urlsplit(settings.REDIS_URL or "redis://127.0.0.1:6379/0")
    database = int(parts.path.lstrip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{14 if database != 14 else 15}"))


def soak_database_url() -> str:
    """The test database's server, with a database name the soak takes as its own."""
    return urlunsplit(urlsplit(database_url_for_subprocess())._replace(path=f"/hopbase_soak_test_{uuid.uuid4().hex[:8]}"))


def printed(output: str, label: str) -> int:
    match = re.search(rf"^{re.escape(label)}:\s+(\d+)", output, re.MULTILINE)
    assert match, f"no {label!r} line in the soak's output:\n{output}"
    return int(match.group(1))


@pytest.mark.gateway
def test_a_short_soak_loses_nothing_charges_nothing_twice_and_leaks_no_slot():
    if connection.vendor != "postgresql":
        pytest.skip("the soak runs on PostgreSQL (set DATABASE_URL)")
    env = {name: value for name, value in os.environ.items() if not name.startswith("HOPBASE_")}
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--duration", str(DURATION), "--database-url", soak_database_url(),
         "--redis-url", soak_redis_url()],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=WITHIN, stdin=subprocess.DEVNULL,
    )
    output = done.stdout
    assert done.returncode == 0, f"the soak failed ({done.returncode}):\n{output}\n--- its log ---\n{done.stderr[-6000:]}"
    sent = printed(output, "requests sent")
    rows = printed(output, "request rows")
    assert sent > 100, output
    assert 0 < rows <= sent, output
    assert printed(output, "rows missing") == 0
    assert printed(output, "double charges") == 0
    assert printed(output, "leaked slots") == 0
    assert printed(output, "unsettled rows") == 0
    assert re.search(r"^checkledger: ok", output, re.MULTILINE), output
    # The soak did what it says: both kinds of trouble happened.
    chaos = re.search(r"^chaos:\s+(\d+) Redis outages .* worker killed (\d+) times", output, re.MULTILINE)
    assert chaos and int(chaos.group(1)) > 0 and int(chaos.group(2)) > 0, output
