"""Where a webhook may connect: public addresses only, unless an operator allows a private host or range.

A channel's URL is set by an admin, but the worker posts from inside the cluster's network, next to cloud
metadata (169.254.169.254), the database and every internal service: a URL naming one of those would turn
faultline into a proxy to them. So a target's host is resolved, every address it resolves to must be
globally routable (or inside FAULTLINE_WEBHOOK_ALLOWED_PRIVATE), and the request goes to the address that
was checked, not to a second lookup that a rebinding DNS server could answer differently. Redirects are
never followed (the worker's client keeps httpx's default), so a public host cannot bounce a post inward.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx

from service.config import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedAddress(httpx.TransportError):
    """The target resolves to an address no channel may post to; retrying will not change that."""


def _kind(address: IPAddress) -> str:
    for name in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{name}"):
            return name.replace("_", "-")
    return "non-public"


def allowed(host: str, address: IPAddress, allowed_private: Sequence[str]) -> bool:
    """A public address, or one an operator allowed by range (CIDR) or by host name (shell pattern)."""
    if address.is_global and not address.is_multicast:
        return True
    for entry in allowed_private:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            if fnmatch.fnmatchcase(host.lower(), entry.lower()):
                return True
    return False


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the host resolves to (an IP literal is itself); socket.gaierror when it does not."""
    addresses: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        # An IPv4 address written as IPv6 (::ffff:127.0.0.1) is that IPv4 address.
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address not in addresses:
            addresses.append(address)
    return addresses


def checked_address(host: str, port: int, allowed_private: Sequence[str]) -> IPAddress:
    """The address to connect to: the first the host resolves to, once every one of them is allowed.

    Every one, because a name that resolves to a public and a private address could be connected either way.
    Raises RefusedAddress, or socket.gaierror when the name does not resolve."""
    addresses = resolve(host, port)
    if not addresses:
        raise socket.gaierror(f"{host} has no address")
    for address in addresses:
        if not allowed(host, address, allowed_private):
            raise RefusedAddress(
                f"host {host!r} resolves to {address}, a {_kind(address)} address: webhooks post only to public "
                "addresses unless FAULTLINE_WEBHOOK_ALLOWED_PRIVATE allows this host or range"
            )
    return addresses[0]


def creation_problem(url: str, allowed_private: Sequence[str]) -> str | None:
    """Why a channel may not be created with this URL's address, or None. A name that does not resolve here
    is accepted: every send checks again, from the worker."""
    parts = urlsplit(url)
    if not parts.hostname:
        return None  # the URL's own checks say what is wrong with it
    try:
        checked_address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), allowed_private)
    except RefusedAddress as exc:
        return str(exc)
    except (OSError, UnicodeError):
        return None
    return None


class PublicOnlyTransport(httpx.BaseTransport):
    """An httpx transport that connects only to checked addresses: the request goes to the IP that was
    checked, with the original Host header and TLS server name, so certificates are verified as usual."""

    def __init__(self, allowed_private: Sequence[str], inner: httpx.BaseTransport | None = None) -> None:
        self._allowed_private = list(allowed_private)
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        try:
            address = checked_address(host, port, self._allowed_private)
        except (OSError, UnicodeError) as exc:
            raise httpx.ConnectError(f"could not resolve host {host!r}: {exc}", request=request) from None
        request.url = request.url.copy_with(host=str(address))
        request.extensions = {**request.extensions, "sni_hostname": host}
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def client(settings: Settings) -> httpx.Client:
    """The client every webhook post goes through: public addresses only, no redirects, no proxy from the
    environment (a proxy would connect on its own terms)."""
    return httpx.Client(
        timeout=settings.webhook_timeout_s,
        transport=PublicOnlyTransport(settings.webhook_allowed_private),
        follow_redirects=False,
        trust_env=False,
    )
