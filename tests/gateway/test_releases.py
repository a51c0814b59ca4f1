"""Releases (gateway.relay.releases): what a request holds is let go of in reverse
order, each once, all of it even when one release fails."""

from __future__ import annotations

import pytest

from gateway.relay.releases import Releases


def test_releases_run_in_reverse_order_of_taking_and_only_once():
    released: list[str] = []
    held = Releases()
    held.callback(released.append, "key slot")
    held.callback(released.append, "channel slot")
    held.callback(released.append, "attempt")
    held.close()
    held.close()
    assert released == ["attempt", "channel slot", "key slot"]


def test_a_failing_release_does_not_keep_the_others_from_running(caplog):
    released: list[str] = []

    def broken(what: str) -> None:
        raise RuntimeError(f"{what} gone")

    held = Releases()
    held.callback(released.append, "first")
    held.callback(broken, "limits")
    held.callback(broken, "board")
    held.callback(released.append, "last")
    with pytest.raises(RuntimeError, match="board gone"):
        held.close()
    assert released == ["last", "first"]
    assert "limits gone" in caplog.text


def test_what_is_taken_over_is_let_go_of_first_and_the_giver_holds_nothing():
    released: list[str] = []
    run, attempt = Releases(), Releases()
    run.callback(released.append, "key slot")
    attempt.callback(released.append, "channel slot")
    attempt.callback(released.append, "attempt")
    run.take_over(attempt)
    attempt.close()
    assert released == []
    run.close()
    assert released == ["attempt", "channel slot", "key slot"]


def test_leaving_the_block_lets_go_even_on_an_error():
    released: list[str] = []
    with pytest.raises(ValueError), Releases() as held:
        held.callback(released.append, "slot")
        raise ValueError("hold failed")
    assert released == ["slot"]
