"""Which webhook URLs a run may give (langgraph.json `webhooks.url`): checked when the run is created and
again before each POST, so a client cannot make the server call into its own network."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from threadline.config import WebhookPolicy
from threadline.errors import InvalidInput


class WebhookRefused(InvalidInput):
    """The webhook URL is not allowed by this server's webhook policy."""


def is_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, link-local (169.254.0.0/16: cloud metadata services), private, shared, reserved, multicast
    or unspecified: an address that is not the public internet."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (address.is_loopback or address.is_link_local or address.is_private or address.is_reserved
            or address.is_multicast or address.is_unspecified or not address.is_global)


class WebhookGuard:
    """A `WebhookPolicy` applied. `refuse_internal`: addresses that are not public are refused (the
    default once authentication is on; `webhooks.url.allow_private_networks` decides when given)."""

    def __init__(self, policy: WebhookPolicy, *, authenticated: bool) -> None:
        self.policy = policy
        allow = policy.allow_private_networks
        self.refuse_internal = (not allow) if allow is not None else authenticated

    async def check(self, url: str) -> None:
        """Raise `WebhookRefused` unless `url` may be called."""
        policy = self.policy
        if len(url) > policy.max_url_length:
            raise WebhookRefused(f"webhook URL longer than {policy.max_url_length} characters")
        if url.startswith("/"):
            if policy.disable_loopback:
                raise WebhookRefused("relative webhook URLs are disabled (webhooks.url.disable_loopback)")
            return
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebhookRefused("webhook must be an http(s) URL or a path of this server")
        if policy.require_https and parts.scheme != "https":
            raise WebhookRefused("webhook must use https (webhooks.url.require_https)")
        host = parts.hostname.lower().rstrip(".")
        if policy.allowed_domains and not any(
                host == d or (d.startswith("*.") and host.endswith(d[1:])) for d in policy.allowed_domains):
            raise WebhookRefused(f"webhook host {host!r} is not in webhooks.url.allowed_domains")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise WebhookRefused("webhook URL has an invalid port") from None
        if policy.allowed_ports and port not in policy.allowed_ports:
            raise WebhookRefused(f"webhook port {port} is not in webhooks.url.allowed_ports")
        if self.refuse_internal:
            for address in await _addresses(host, port):
                if is_internal(address):
                    raise WebhookRefused(
                        f"webhook host {host!r} is a loopback, link-local or private address; this server "
                        "does not call its own network (webhooks.url.allow_private_networks)")


async def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise WebhookRefused(f"webhook host {host!r} does not resolve") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
