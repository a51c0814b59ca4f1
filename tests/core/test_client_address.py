"""The client address the throttles count by (core.client_address):
X-Forwarded-For is believed only from a trusted proxy, and only its
right-most hop that is not itself a trusted proxy."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory

from core.client_address import client_address, parse_networks, resolve
from hopbase.settings import env_networks


def request(peer: str | None, forwarded: str | None = None):
    meta = {}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    req = RequestFactory().get("/admin/login/", **meta)
    if peer is None:
        del req.META["REMOTE_ADDR"]
    else:
        req.META["REMOTE_ADDR"] = peer
    return req


def test_without_trusted_proxies_the_header_is_ignored(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ()
    assert client_address(request("203.0.113.7", "198.51.100.1")) == "203.0.113.7"


def test_an_untrusted_peer_cannot_claim_another_address(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    assert client_address(request("203.0.113.7", "10.1.1.1, 198.51.100.1")) == "203.0.113.7"


def test_behind_a_trusted_proxy_the_right_most_hop_is_the_client(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.5",)
    # The client forged "1.1.1.1"; nginx appended what it saw.
    assert client_address(request("10.0.0.5", "1.1.1.1, 198.51.100.9")) == "198.51.100.9"


def test_trusted_hops_are_skipped_from_the_right(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8", "fd00::/8")
    forwarded = "1.1.1.1, 198.51.100.9, 10.2.0.1, fd00::2"
    assert client_address(request("10.0.0.5", forwarded)) == "198.51.100.9"


def test_every_hop_trusted_gives_the_furthest(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    assert client_address(request("10.0.0.5", "10.9.9.9, 10.0.0.6")) == "10.9.9.9"


def test_a_trusted_proxy_without_the_header_is_the_client(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    assert client_address(request("10.0.0.5")) == "10.0.0.5"


def test_ports_brackets_and_mapped_addresses_are_normalised(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("127.0.0.1", "::1")
    assert client_address(request("::ffff:127.0.0.1", "198.51.100.9:4711")) == "198.51.100.9"
    assert client_address(request("::1", "[2001:db8::1]:443")) == "2001:db8::1"
    assert client_address(request("::1", "2001:DB8:0::1")) == "2001:db8::1"


def test_garbage_from_a_trusted_proxy_stops_at_the_nearest_honest_hop(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    assert client_address(request("10.0.0.5", "unknown, 10.0.0.7")) == "10.0.0.7"


def test_no_peer_is_unknown(settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    assert client_address(request(None, "198.51.100.9")) == "unknown"


def test_resolve_is_usable_without_a_request():
    networks = parse_networks(["192.0.2.0/24"])
    assert resolve("192.0.2.1", "198.51.100.3", networks) == "198.51.100.3"
    assert resolve("198.51.100.3", "192.0.2.1", networks) == "198.51.100.3"


def test_the_setting_parses_addresses_and_networks(monkeypatch):
    monkeypatch.setenv("HOPBASE_TRUSTED_PROXIES", " 10.0.0.0/8 ,::1, 172.16.0.1")
    assert env_networks("HOPBASE_TRUSTED_PROXIES") == ("10.0.0.0/8", "::1/128", "172.16.0.1/32")
    monkeypatch.delenv("HOPBASE_TRUSTED_PROXIES")
    assert env_networks("HOPBASE_TRUSTED_PROXIES") == ()


@pytest.mark.parametrize("bad", ["bogus", "10.0.0.0/33", "1.2.3"])
def test_a_bad_trusted_proxy_stops_start_up_naming_the_setting(monkeypatch, bad):
    monkeypatch.setenv("HOPBASE_TRUSTED_PROXIES", bad)
    with pytest.raises(ImproperlyConfigured, match="HOPBASE_TRUSTED_PROXIES"):
        env_networks("HOPBASE_TRUSTED_PROXIES")
