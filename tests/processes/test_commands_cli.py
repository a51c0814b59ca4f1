"""The operator commands from the command line (the operator contract, docs/operations.md): a refused
command or a usage mistake exits non-zero with a single line on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db


# From the command line: exit status and a single stderr line.


def manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )


def test_a_bad_value_exits_non_zero_with_one_line():
    result = manage("setprice", "gpt-a", "--input", "-1", "--output", "1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["CommandError: --input: '-1' must not be negative"]


@pytest.mark.parametrize(
    "argv",
    [["topup"], ["balance"], ["createapikey"], ["addchannel", "x"], ["setprice", "m", "--input", "1"], ["checkledger", "--nope"]],
)
def test_a_usage_mistake_is_one_line_on_stderr_and_a_failed_exit(argv):
    import subprocess
    import sys

    from django.conf import settings

    done = subprocess.run([sys.executable, "manage.py", *argv], cwd=settings.BASE_DIR, capture_output=True, text=True)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""
