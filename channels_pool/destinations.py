"""Where an operator may point a channel (its base URL): at a provider, a
cloud, or a model server of their own on a private network; at this machine
(loopback) only while HOPBASE_ALLOW_LOOPBACK_CHANNELS is on (the default: a
model server beside the gateway, the built-in simulator in tests and the
demo; turn it off where nothing there is a provider); never at the
link-local range, where clouds keep their instance metadata and
credentials, nor an unspecified or multicast address. A channel's requests
carry the operator's credentials and its test button shows the answer's
words: pointed at the gateway's own neighbourhood, it would be a way to
read it. (The test button also shows no words from an answer that is not a
provider's error: channels_pool.probe.)

The host is checked when the channel is saved (the admin, ``addchannel``)
and again when it is tested: a literal address, or every address its name
resolves to then. A name that does not resolve is let through (it fails
like any unreachable channel).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


class LocalDestination(ValueError):
    pass


def check_destination(base_url: str) -> None:
    """Raise ``LocalDestination`` if a channel may not point at ``base_url``."""
    host = (urlsplit(base_url).hostname or "").rstrip(".").lower()
    if not host:
        return  # the kind's own check says what is wrong with the URL
    loopback_allowed = settings.HOPBASE_ALLOW_LOOPBACK_CHANNELS
    if host in LOCAL_NAMES or host.endswith(".localhost"):
        if not loopback_allowed:
            raise LocalDestination(_message(host, "this machine"))
        return
    for address in _addresses(host):
        if address.is_link_local or address.is_unspecified or address.is_multicast:
            raise LocalDestination(_message(host, "a link-local, unspecified or multicast address"))
        if address.is_loopback and not loopback_allowed:
            raise LocalDestination(_message(host, "this machine"))


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # ::ffff:169.254.169.254 reaches 169.254.169.254
        return [getattr(literal, "ipv4_mapped", None) or literal]
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    addresses = []
    for *_, sockaddr in found:
        try:
            address = ipaddress.ip_address(sockaddr[0].split("%")[0])
        except ValueError:
            continue
        # An IPv4 address written as IPv6 (::ffff:127.0.0.1) is its IPv4 self.
        mapped = getattr(address, "ipv4_mapped", None)
        addresses.append(mapped or address)
    return addresses


def _message(host: str, what: str) -> str:
    allowed = " (HOPBASE_ALLOW_LOOPBACK_CHANNELS=1 allows it)" if what == "this machine" else ""
    return f"{host} is {what}: a channel may not point there{allowed}."
