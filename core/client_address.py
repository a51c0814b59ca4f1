"""The address a request came from, for throttles (admin logins, failed API
authentication).

Behind a reverse proxy (nginx, a load balancer) every request's peer is the
proxy, so the client's address has to come from ``X-Forwarded-For``; but that
header is whatever the client chose to send, except for the hops the proxies
we trust appended. So it is believed only when the direct peer is one of
``HOPBASE_TRUSTED_PROXIES`` (addresses or CIDR networks; none by default),
and then only its right-most hop that is not itself a trusted proxy: each
trusted proxy appends the address it saw, so everything to the left of the
first untrusted hop (counting from the right) may be forged.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

UNKNOWN = "unknown"


def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``"10.0.0.1"``, ``"10.0.0.0/8"``, ``"::1"``… as networks; raises
    ``ValueError`` on anything else (settings names the variable)."""
    networks = []
    for entry in entries:
        entry = entry.strip()
        if entry:
            networks.append(ipaddress.ip_network(entry, strict=False))
    return tuple(networks)


@lru_cache(maxsize=8)
def trusted_networks(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return parse_networks(entries)


def parse_address(text: str) -> IPAddress | None:
    """An address as a proxy may write it: bare, ``1.2.3.4:port``,
    ``[v6]`` or ``[v6]:port``; IPv4-mapped IPv6 as IPv4. None if it is not one."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]  # IPv4 with a port
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted(address: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def resolve(peer: str | None, forwarded_for: str | None, networks: tuple[IPNetwork, ...]) -> str:
    """The client's address from the direct peer and ``X-Forwarded-For``
    (all its values joined with commas)."""
    peer_address = parse_address(peer or "")
    if peer_address is None:
        return (peer or "").strip() or UNKNOWN
    if not networks or not forwarded_for or not is_trusted(peer_address, networks):
        return str(peer_address)
    nearest = peer_address  # the last hop known to be honest
    for hop in reversed(forwarded_for.split(",")):
        address = parse_address(hop)
        if address is None:
            # A trusted proxy wrote something that is not an address: the
            # client cannot be told apart any further than the proxy.
            return str(nearest)
        if not is_trusted(address, networks):
            return str(address)
        nearest = address
    return str(nearest)  # every hop a trusted proxy: the furthest one


def client_address(request) -> str:
    """The client's address for a Django request (``REMOTE_ADDR`` and the
    ``X-Forwarded-For`` header), as a normalised string; ``"unknown"`` when
    the server gave no peer (a Unix socket)."""
    networks = trusted_networks(tuple(getattr(settings, "HOPBASE_TRUSTED_PROXIES", ())))
    return resolve(request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR"), networks)
